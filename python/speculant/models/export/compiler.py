"""The C++ compiler a `.pt2` package's library is built with (export_pt2): the one Inductor finds, through a
wrapper that makes the library use its own copies of the inline and template code it compiles.

Why. The library compiles torch's AOTInductor runtime headers, whose inline code runs in it: model_base.h's
parse_device_str matches the device string with a std::regex when a model is created. GCC emits the
function-local statics of inline functions as GNU unique symbols, which the dynamic linker binds to the first
copy anywhere in the process, and binds calls to a library's weak (template) functions to the first copy in the
process's global scope. Either can be another library's copy, compiled by another compiler: on the development
VM the std::regex statics of every package's library bind to those of libcufile.so.0, a CUDA library torch
loads, built with GCC 11 (`python benchmarks/pt2_load_check.py` prints where they bind). On the GPU image of
issue 21 (torch 2.11.0+cu130) every package's load died of a segmentation fault inside std::regex in
parse_device_str, torch's own loader included, where this VM loads the same packages. Of the libraries torch
2.11+cu130 loads, only libtorch_cpu.so (built with GCC 13.3) holds std::regex statics (checked on its wheels);
a library compiled by another GCC there would use them. Whether that is the crash is not known: pt2_load_check.py
builds a package both ways and prints the compiler and the bindings, for the next GPU lease to tell.

The wrapper adds -fno-gnu-unique to every compilation (the statics become ordinary weak symbols) and links the
library with -Wl,-Bsymbolic (its references to symbols it defines bind to its own definitions). The library's
interface to torch is C functions it does not define (AOTInductor's shim), which -Bsymbolic leaves to the
dynamic linker. Only for GCC on Linux (ELF); elsewhere the compiler is used as Inductor finds it.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _is_gcc(compiler: str) -> bool:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    lines = (out.stdout or "").splitlines()
    return bool(lines) and "clang" not in lines[0].lower() and bool(
        re.search(r"(^|[\s/(-])(gcc|g\+\+|GCC)([\s)-]|$)", lines[0]))


def _folder() -> Path:
    return Path(tempfile.gettempdir()) / f"speculant-{os.getuid()}" / "compilers"


def bound_locally(compiler: str) -> Path:
    """The wrapper of `compiler` (an absolute path: the wrapper is itself named g++), at a path of its own per
    compiler and user, written once (atomically), so that Inductor's cache keys stay the same across exports."""
    if not os.path.isabs(compiler):
        raise ValueError(f"compiler must be an absolute path, got {compiler!r}")
    key = hashlib.sha1(compiler.encode()).hexdigest()[:12]
    wrapper = _folder() / key / "g++"
    text = (f'#!/bin/sh\n# speculant.export.compiler: {compiler}, its own copies of inline code bound locally\n'
            f'case " $* " in *" -shared "*) exec "{compiler}" "$@" -fno-gnu-unique -Wl,-Bsymbolic;; esac\n'
            f'exec "{compiler}" "$@" -fno-gnu-unique\n')
    if not wrapper.exists() or wrapper.read_text() != text:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        temporary = wrapper.with_name(f".g++.{os.getpid()}.tmp")
        temporary.write_text(text)
        temporary.chmod(0o755)
        os.replace(temporary, wrapper)
    return wrapper


def inductor_options() -> dict:
    """Inductor's options for a package's compilation (aot_compile's options=): {"cpp.cxx": (None, wrapper)}
    where Inductor's compiler is GCC on Linux, {} elsewhere. (The wrapper is named g++, as Inductor tells GCC
    from clang by the name in some releases.)"""
    if not sys.platform.startswith("linux"):
        return {}
    from torch._inductor import cpp_builder

    compiler = shutil.which(cpp_builder.get_cpp_compiler())
    if compiler is None or not _is_gcc(compiler):
        return {}
    if Path(compiler).parent.parent == _folder():  # already a wrapper (cpp.cxx set to one)
        return {"cpp.cxx": (None, compiler)}
    return {"cpp.cxx": (None, str(bound_locally(compiler)))}


__all__ = ["bound_locally", "inductor_options"]
