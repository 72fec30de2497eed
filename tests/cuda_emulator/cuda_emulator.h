#pragma once
// CUDA C++ kernels compiled by the host compiler and run on CPU threads, so that cpp/kernels/*.cu run and are
// checked where no GPU is: one OS thread per CUDA thread of a block, the blocks of a grid one after another.
// __syncthreads and the warp shuffles are barriers: __syncthreads over the threads that have not returned, a
// shuffle over its whole warp. A barrier that some thread never reaches, a __syncthreads reached at two places at
// once, or a full-mask shuffle after a lane of its warp returned stops the run with a message. Built with
// -fsanitize=address, reads and writes out of a buffer's bounds are reported (compute-sanitizer's memcheck); with
// -fsanitize=thread, races on shared memory between barriers (its racecheck). Force-included (g++ -include) ahead
// of a .cu file compiled as C++ with -DSPECULANT_CUDA_EMULATOR. Not emulated: blocks running at the same time
// (races between blocks go unseen), shared memory's undefined start (a __shared__ variable is a static one: zero
// in the first block, what the previous block left in the others), and the warps' own ordering (to
// ThreadSanitizer a shuffle orders all of its warp's memory, as __syncwarp would).
#define __global__
#define __device__
#define __host__
#define __shared__ static
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <type_traits>

#undef __launch_bounds__
#define __launch_bounds__(...)

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

namespace speculant::emulator {

// Runs kernel() as every thread of every block of `grid`; a launch error (as cudaGetLastError reports it) or 0.
int run(dim3 grid, dim3 block, const std::function<void()>& kernel);
// A trap of the last run, or an empty string.
const char* trapped();

void sync_block(const std::source_location& where);
void exchange_in_warp(unsigned mask, void* value, int bytes, int lane_mask);
[[noreturn]] void trap();

}  // namespace speculant::emulator

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  speculant::emulator::sync_block(where);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) <= 8);
  speculant::emulator::exchange_in_warp(mask, &value, sizeof(T), lane_mask);
  return value;
}

template <typename T>
T __ldg(const T* p) {
  return *p;
}

[[noreturn]] inline void __trap() { speculant::emulator::trap(); }

inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// CUDA's integer min and max, for operands of one type (a mixed call would pick another overload there)
template <typename T>
T min(T a, T b) {
  static_assert(std::is_integral_v<T>);
  return a < b ? a : b;
}
template <typename T>
T max(T a, T b) {
  static_assert(std::is_integral_v<T>);
  return a > b ? a : b;
}
