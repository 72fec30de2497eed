// Runs one launch of cpp/kernels/*.cu under the CUDA emulator: `harness DIR` reads DIR/args.txt (a line per
// argument: its name and value(s); "buffer NAME" for each pointer, read from DIR/NAME.bin into an allocation of
// exactly its size, 16-byte aligned), calls the kernel's launcher (launch.h) and writes every buffer back to
// DIR/NAME.out. Exit status: 0 done, 2 bad arguments, 3 the kernel trapped, 4 the launcher returned an error.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_emulator.h"
#include "kernels/launch.h"

namespace {

using namespace speculant::kernels;

[[noreturn]] void refuse(const std::string& what) {
  std::fprintf(stderr, "harness: %s\n", what.c_str());
  std::exit(2);
}

struct Buffer {
  std::byte* data;
  size_t size;
};

struct Case {
  std::string dir;
  std::map<std::string, std::vector<std::string>> values;
  std::map<std::string, Buffer> buffers;

  const std::string& text(const std::string& name) const {
    const auto found = values.find(name);
    if (found == values.end() || found->second.empty()) refuse("args.txt has no " + name);
    return found->second[0];
  }
  int64_t integer(const std::string& name, size_t i = 0) const {
    const auto found = values.find(name);
    if (found == values.end() || found->second.size() <= i) refuse("args.txt has no " + name + "[" + std::to_string(i) + "]");
    return std::stoll(found->second[i]);
  }
  float real(const std::string& name) const { return std::stof(text(name)); }
  template <typename T = void>
  T* pointer(const std::string& name) const {  // null for a buffer not given
    const auto found = buffers.find(name);
    return found == buffers.end() ? nullptr : reinterpret_cast<T*>(found->second.data);
  }
  template <typename Named>
  Named named(const std::string& name, const std::map<std::string, Named>& names) const {
    const auto found = names.find(text(name));
    if (found == names.end()) refuse("unknown " + name + " '" + text(name) + "'");
    return found->second;
  }
  Dtype dtype() const {
    return named<Dtype>("dtype", {{"float32", Dtype::float32}, {"bfloat16", Dtype::bfloat16},
                                  {"float16", Dtype::float16}});
  }
};

Case read_case(const std::string& dir) {
  Case c{dir, {}, {}};
  std::ifstream args(dir + "/args.txt");
  if (!args) refuse("cannot read " + dir + "/args.txt");
  for (std::string line; std::getline(args, line);) {
    std::istringstream words(line);
    std::string name;
    if (!(words >> name)) continue;
    std::vector<std::string> rest{std::istream_iterator<std::string>(words), {}};
    if (name != "buffer") {
      c.values[name] = rest;
      continue;
    }
    if (rest.size() != 1) refuse("a buffer line names one buffer: " + line);
    std::ifstream file(dir + "/" + rest[0] + ".bin", std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(file), {}};
    auto* data = static_cast<std::byte*>(::operator new[](bytes.size() + (bytes.empty() ? 1 : 0),
                                                           std::align_val_t{16}));
    std::memcpy(data, bytes.data(), bytes.size());
    c.buffers[rest[0]] = Buffer{data, bytes.size()};
  }
  return c;
}

int launch_linear_case(const Case& c) {
  LinearArgs a{};
  a.x = c.pointer("x"), a.weight = c.pointer("weight"), a.bias = c.pointer("bias");
  a.norm_weight = c.pointer("norm_weight"), a.norm_bias = c.pointer("norm_bias"), a.out = c.pointer("out");
  a.x_stride = c.integer("x_stride"), a.out_stride = c.integer("out_stride");
  a.rows = c.integer("rows"), a.n = c.integer("n"), a.k = c.integer("k");
  a.eps = c.real("eps");
  a.input = c.named<LinearInput>("input", {{"none", LinearInput::none}, {"rms_norm", LinearInput::rms_norm},
                                           {"layer_norm", LinearInput::layer_norm},
                                           {"activation", LinearInput::activation}, {"gated", LinearInput::gated}});
  a.activation = c.named<Activation>("activation", {{"identity", Activation::identity}, {"silu", Activation::silu},
                                                    {"gelu", Activation::gelu}, {"gelu_tanh", Activation::gelu_tanh},
                                                    {"relu", Activation::relu}});
  a.accumulate = c.integer("accumulate") != 0;
  a.dtype = c.dtype();
  return launch_linear(a, nullptr);
}

int launch_rotate_case(const Case& c) {
  RotaryArgs a{};
  a.qkv = c.pointer("qkv"), a.cos = c.pointer("cos"), a.sin = c.pointer("sin"), a.q = c.pointer("q");
  a.cache = c.pointer("cache"), a.rows = c.pointer<int64_t>("rows"), a.slots = c.pointer<int64_t>("slots");
  a.cos_row_stride = c.integer("cos_row_stride");
  for (int i = 0; i < 4; ++i) a.cache_stride[i] = c.integer("cache_stride", i);
  a.cache_rows = c.integer("cache_rows"), a.cache_slots = c.integer("cache_slots");
  a.batch = c.integer("batch"), a.tokens = c.integer("tokens"), a.heads = c.integer("heads");
  a.kv_heads = c.integer("kv_heads"), a.head_dim = c.integer("head_dim"), a.start = c.integer("start");
  a.dtype = c.dtype();
  return launch_rotate_and_cache(a, nullptr);
}

int launch_attention_case(const Case& c) {
  AttentionArgs a{};
  a.q = c.pointer("q"), a.k = c.pointer("k"), a.v = c.pointer("v"), a.mask = c.pointer("mask");
  a.out = c.pointer("out"), a.partial = c.pointer<float>("partial");
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = c.integer("q_stride", i), a.k_stride[i] = c.integer("k_stride", i);
    a.v_stride[i] = c.integer("v_stride", i), a.mask_stride[i] = c.integer("mask_stride", i);
  }
  a.batch = c.integer("batch"), a.heads = c.integer("heads"), a.rows = c.integer("rows");
  a.mask_rows = c.integer("mask_rows"), a.keys = c.integer("keys"), a.head_dim = c.integer("head_dim");
  a.scale = c.real("scale"), a.dtype = c.dtype();
  if (c.values.count("multiprocessors") == 0) {
    a.splits = c.integer("splits");
    return launch_decode_attention(a, nullptr);
  }
  // as ops.cpp calls it on a device of that many multiprocessors: its chunks, and their partial results' buffer
  a.splits = attention_splits(a.batch, a.heads, a.rows, a.keys, c.integer("multiprocessors"));
  std::vector<float> partial(a.splits > 1 ? static_cast<size_t>(a.splits) * a.batch * a.heads * a.rows *
                                                (a.head_dim + 2) : 0);
  a.partial = a.splits > 1 ? partial.data() : nullptr;
  return launch_decode_attention(a, nullptr);
}

int launch_rms_norm_case(const Case& c) {
  return launch_rms_norm(c.pointer("x"), c.pointer("weight"), c.pointer("y"), c.integer("rows"), c.integer("width"),
                         c.real("eps"), c.dtype(), nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) refuse("usage: harness DIR");
  const Case c = read_case(argv[1]);
  const std::string& kernel = c.text("kernel");
  int error;
  if (kernel == "linear") error = launch_linear_case(c);
  else if (kernel == "rotate_and_cache") error = launch_rotate_case(c);
  else if (kernel == "decode_attention") error = launch_attention_case(c);
  else if (kernel == "rms_norm") error = launch_rms_norm_case(c);
  else refuse("unknown kernel '" + kernel + "'");
  if (error != 0) {
    std::fprintf(stderr, "harness: the launcher returned CUDA error %d\n", error);
    return 4;
  }
  for (const auto& [name, buffer] : c.buffers) {
    std::ofstream out(c.dir + "/" + name + ".out", std::ios::binary);
    out.write(reinterpret_cast<const char*>(buffer.data), static_cast<std::streamsize>(buffer.size));
  }
  if (*speculant::emulator::trapped() != '\0') {
    std::fprintf(stderr, "harness: %s\n", speculant::emulator::trapped());
    return 3;
  }
  return 0;
}
