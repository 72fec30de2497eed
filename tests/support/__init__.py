"""What the test modules share: import from here (`from support.laws import assert_law`), never from a test_*.py
module. conftest.py puts tests/ on sys.path; fixtures stay in conftest.py or the test module that uses them.

block_laws           the exact law of one block-verification iteration (Sun et al.'s rule), enumerated
chisquare            Pearson's chi-square test of samples against an exact law (cells pooled), SIGNIFICANCE
decoding_references  TinyGPT targets and a pure-torch greedy loop that decoding must equal; transformers' beam search
drafter_sets         model-free drafters (speculant.drafters) built alike for several modules
emulated_kernels     cpp/kernels/*.cu run on the CPU under sanitizers (with tests/cuda_emulator/)
engine_checks        checks of a Result (stats, rows, same results) and the engine tests' models (MarkovRows, TinyGPT)
hf_families          the zoo of tiny random transformers models, one per family; the .pt2 zoo's sizes; random_ids
hf_models            the export tests' small GPT-2, Llama and T5 models, indexed by PROMPTS
kernel_checks        a fused kernel's output against a float64 CPU reference, with each dtype's tolerance
laws                 assertions on output laws (assert_law over token windows) and the batched samples they take
live_reference       transformers' own answers: greedy generate, logits, the exact two-token law
markov               table-driven Markov models in both TorchScript forms and their exact enumerated laws
reference            pure-torch float64 reference implementations of the sampling math (standardize, verify, ...)
traversal_laws       the exact law of one traversal-verification iteration (verification="block" on a tree)
tree_laws            the exact law of one token-tree iteration, enumerated on Markov tables; trees drawn as drafted
"""
