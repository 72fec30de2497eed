// Python bindings: Standardized and speculative sampling, and the step kernels the tests drive directly.
#include "bindings/bindings.h"

#include "device/read_back.h"
#include "math/cpu_kernels.h"
#include "math/sampling.h"
#include "math/speculative.h"
#include "math/streams.h"
#include "math/step.h"

namespace speculant::bindings {

void bind_sampling(py::module_& m) {
  m.def("check_sampling", [](double temperature, int64_t top_k, double top_p,
                             double lenience) { make_config(temperature, top_k, top_p, lenience); },
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("lenience"));
  m.def("standardize",
        [](const at::Tensor& logits, double temperature, int64_t top_k, double top_p) {
          SamplingConfig config = make_config(temperature, top_k, top_p, 1.0);
          at::Tensor probs = standardize(logits, config);
          check_finite(logits, "logits");
          return probs;
        },
        py::arg("logits"), py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0);
  m.def("acceptance_probability",
        [](const at::Tensor& p_x, const at::Tensor& q_x, double lenience) {
          make_config(1.0, 0, 1.0, lenience);
          check_probabilities(p_x, "p_x");
          check_probabilities(q_x, "q_x");
          return acceptance_probability(p_x, q_x, lenience);
        },
        py::arg("p_x"), py::arg("q_x"), py::arg("lenience") = 1.0);
  m.def("residual",
        [](const at::Tensor& p, const at::Tensor& q) {
          check_probabilities(p, "p");
          check_probabilities(q, "q");
          require(p.sizes() == q.sizes(), "p and q must have the same shape, got [{}] and [{}]",
                  fmt::join(p.sizes(), ", "), fmt::join(q.sizes(), ", "));
          return residual(p, q);
        },
        py::arg("p"), py::arg("q"));
  m.def("verify",
        [](const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& draft_tokens,
           double temperature, int64_t top_k, double top_p, double lenience) {
          check_finite(target_logits, "target_logits");
          check_probabilities(q, "q");
          Verification v =
              verify(target_logits, q, draft_tokens, make_config(temperature, top_k, top_p, lenience));
          return py::make_tuple(v.accept_prob, v.next_dist);
        },
        py::arg("target_logits"), py::arg("q"), py::arg("draft_tokens"), py::arg("temperature") = 1.0,
        py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("lenience") = 1.0);
  m.def("sample",
        [](const at::Tensor& probs, uint64_t seed) {
          check_probabilities(probs, "probs");
          require(probs.dim() == 2 && (probs.sum(-1) > 0).all().item<bool>(),
                  "probs must be [n, vocab] with positive mass in every row");
          at::Generator generator = make_generator(probs.device(), seed);
          return sample(probs, generator);
        },
        py::arg("probs"), py::arg("seed"));
  m.def("_sample_as_tensors",
        [](const at::Tensor& probs, uint64_t seed) {
          at::Generator generator = make_generator(probs.device(), seed);
          return sample_as_tensors(probs, generator);
        },
        py::arg("probs"), py::arg("seed"));

  // The step kernels (step.h, cpu_kernels.h) for tests: the tensor path on CPU, and the host kernel with given
  // uniforms (so that a test can place them and know exactly which n and t must come out).
  m.def("set_host_kernels", &cpu::set_host_kernels, py::arg("on"),
        "CPU tensors run the host kernels (True, the default) or the accelerators' tensor path; returns the previous "
        "setting (process-wide: speculant.testing.tensor_path)");
  m.def("_host_reads", [] {
          const HostReads reads = host_reads();
          return py::make_tuple(reads.reads, reads.values);
        },
        "(reads, values): the device -> host reads of the decoding loop and its drafters since the process started, "
        "and the elements they copied (read_back.h)");
  m.def("_standardize_as_tensors",
        [](const at::Tensor& logits, double temperature, int64_t top_k, double top_p) {
          return standardize_as_tensors(logits, make_config(temperature, top_k, top_p, 1.0));
        },
        py::arg("logits"), py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0);
  m.def("_verify_step",
        [](const at::Tensor& target_logits, const at::Tensor& q, const at::Tensor& draft_tokens, double temperature,
           int64_t top_k, double top_p, double lenience, const std::vector<double>& uniforms,
           const std::vector<double>& draws, const std::string& verification) {
          const SamplingConfig config = make_config(temperature, top_k, top_p, lenience, verification);
          require(target_logits.is_cpu() && q.is_cpu() && draft_tokens.is_cpu(), "the host kernel takes CPU tensors");
          require(q.dim() == 2 && target_logits.dim() == 2 && q.size(0) + 1 == target_logits.size(0) &&
                      q.size(1) == target_logits.size(1) && draft_tokens.numel() == q.size(0),
                  "shapes must be target_logits [gamma + 1, V], q [gamma, V], draft_tokens [gamma]");
          const at::Tensor drafted = draft_tokens.to(at::kLong).contiguous();
          require(drafted.numel() == 0 || (drafted.min().item<int64_t>() >= 0 &&
                                           drafted.max().item<int64_t>() < target_logits.size(1)),
                  "draft_tokens must be token ids in [0, {})", target_logits.size(1));
          size_t used = 0, drawn = 0;
          const cpu::Uniform coins = [&] {  // the coins' (and t's where no draws are given), in the kernel's order
            require(used < uniforms.size(), "uniforms: the kernel needed more than the {} given", uniforms.size());
            return uniforms[used++];
          };
          const cpu::Uniform own = [&] {
            require(drawn < draws.size(), "draws: the kernel needed more than the {} given", draws.size());
            return draws[drawn++];
          };
          const Verdict v = cpu::verify(target_logits, q, drafted.const_data_ptr<int64_t>(), config, coins,
                                        draws.empty() ? coins : own);
          return py::make_tuple(v.accepted(), v.host_token, v.betas, used + drawn);
        },
        py::arg("target_logits"), py::arg("q"), py::arg("draft_tokens"), py::arg("temperature"), py::arg("top_k"),
        py::arg("top_p"), py::arg("lenience"), py::arg("uniforms"), py::arg("draws") = std::vector<double>{},
        py::arg("verification") = "token");
  // The key of a row's stream (streams.h): role "draft", "coins" or "correction".
  m.def("_stream_key",
        [](uint64_t seed, const std::string& role, uint64_t step) {
          Stream stream = Stream::draft;
          if (role == "coins") {
            stream = Stream::coins;
          } else if (role == "correction") {
            stream = Stream::correction;
          } else {
            require(role == "draft", "role must be 'draft', 'coins' or 'correction', got '{}'", role);
          }
          return stream_key(seed, stream, step);
        },
        py::arg("seed"), py::arg("role"), py::arg("step"));
}

}  // namespace speculant::bindings
