// Kernel-level test driver: runs one op case through every kernel variant this CPU supports.
//
// Usage: quest_kernel_driver CASE_DIR
// CASE_DIR/case.txt holds "name value" lines (op, activation/cache dtype, dims, attributes);
// inputs are raw little-endian arrays CASE_DIR/<input>.bin. For each variant the driver writes
// CASE_DIR/<variant>.<output>.bin and prints the variant's name. No ONNX Runtime involved: this is
// how the NEON kernels are checked under qemu-aarch64 (tests/test_kernel_variants.py).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/dispatch.h"

namespace {

using quest::DType;

struct Case {
  std::string dir;
  std::map<std::string, std::string> fields;

  const std::string& text(const std::string& key) const {
    auto found = fields.find(key);
    if (found == fields.end()) throw std::runtime_error("case.txt lacks " + key);
    return found->second;
  }
  int64_t integer(const std::string& key) const { return std::stoll(text(key)); }
  float real(const std::string& key) const { return std::stof(text(key)); }
  bool has(const std::string& key) const { return fields.count(key) != 0; }
  DType dtype(const std::string& key) const { return text(key) == "float16" ? DType::F16 : DType::F32; }

  std::vector<char> read(const std::string& name, size_t bytes) const {
    std::ifstream in(dir + "/" + name + ".bin", std::ios::binary);
    std::vector<char> data(bytes);
    if (!in.read(data.data(), static_cast<std::streamsize>(bytes)))
      throw std::runtime_error("cannot read " + std::to_string(bytes) + " bytes of " + name + ".bin");
    return data;
  }
  void write(const std::string& variant, const std::string& name, const void* data, size_t bytes) const {
    std::ofstream out(dir + "/" + variant + "." + name + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  }
};

Case load_case(const std::string& dir) {
  Case c{dir, {}};
  std::ifstream in(dir + "/case.txt");
  if (!in) throw std::runtime_error("cannot open " + dir + "/case.txt");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, value;
    if (words >> key >> value) c.fields[key] = value;
  }
  return c;
}

size_t bytes_of(DType dtype, int64_t count) { return static_cast<size_t>(count) * (dtype == DType::F32 ? 4 : 2); }

void run_metadata(const Case& c, const quest::KernelTable& k) {
  const int64_t B = c.integer("B"), N = c.integer("N"), S = c.integer("S"), D = c.integer("D"), M = c.integer("M");
  const DType T = c.dtype("T"), TC = c.dtype("TC");
  auto key = c.read("key", bytes_of(T, B * N * S * D));
  auto block_max = c.read("block_max", bytes_of(TC, B * N * M * D));
  auto block_min = c.read("block_min", bytes_of(TC, B * N * M * D));
  auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  quest::QuestMetadataParams p;
  p.batch = B, p.kv_heads = N, p.new_tokens = S, p.head_dim = D, p.num_blocks = M, p.block_size = c.integer("P");
  p.past_lens = reinterpret_cast<const int32_t*>(past.data());
  p.total_lens = reinterpret_cast<const int32_t*>(total.data());
  p.key_type = T, p.cache_type = TC, p.key = key.data(), p.block_max = block_max.data(), p.block_min = block_min.data();
  k.quest_metadata(p, 0, B * N);
  c.write(k.isa, "block_max_out", block_max.data(), block_max.size());
  c.write(k.isa, "block_min_out", block_min.data(), block_min.size());
}

void run_select(const Case& c, const quest::KernelTable& k) {
  const int64_t B = c.integer("B"), H = c.integer("H"), N = c.integer("N"), S = c.integer("S"), D = c.integer("D");
  const int64_t M = c.integer("M"), K = c.integer("K");
  const DType T = c.dtype("T"), TC = c.dtype("TC");
  auto query = c.read("query", bytes_of(T, B * H * S * D));
  auto block_max = c.read("block_max", bytes_of(TC, B * N * M * D));
  auto block_min = c.read("block_min", bytes_of(TC, B * N * M * D));
  auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  std::vector<char> importance;
  if (c.integer("with_importance")) importance = c.read("block_importance", 4 * B * N * M);
  std::vector<int32_t> indices(B * N * S * K);
  const bool probe = c.text("score") == "probe";
  std::vector<char> key_cache, key;
  if (probe) {
    key_cache = c.read("key_cache", bytes_of(TC, B * N * c.integer("C") * D));
    key = c.read("key", bytes_of(T, B * N * S * D));
  }
  quest::SparseBlockSelectParams p;
  p.batch = B, p.num_heads = H, p.kv_heads = N, p.query_len = S, p.head_dim = D, p.num_blocks = M;
  p.block_size = c.integer("P"), p.top_k = K, p.sink_blocks = c.integer("sink_blocks");
  p.recent_blocks = c.integer("recent_blocks");
  p.reduce = c.text("group_reduce") == "max" ? quest::GroupReduce::Max : quest::GroupReduce::Mean;
  p.importance_fraction = c.real("importance_fraction");
  p.score = probe ? quest::ScoreMode::Probe : quest::ScoreMode::Bound;
  p.num_probes = c.integer("num_probes");
  p.capacity = probe ? c.integer("C") : 0;
  p.key_cache = probe ? key_cache.data() : nullptr;
  p.key = probe ? key.data() : nullptr;
  p.past_lens = reinterpret_cast<const int32_t*>(past.data());
  p.total_lens = reinterpret_cast<const int32_t*>(total.data());
  p.block_importance = importance.empty() ? nullptr : reinterpret_cast<const float*>(importance.data());
  p.query_type = T, p.cache_type = TC, p.query = query.data(), p.block_max = block_max.data();
  p.block_min = block_min.data(), p.block_indices = indices.data();
  k.sparse_block_select(p, 0, B * N);
  c.write(k.isa, "block_indices", indices.data(), indices.size() * 4);
}

void run_attention(const Case& c, const quest::KernelTable& k) {
  const int64_t B = c.integer("B"), H = c.integer("H"), N = c.integer("N"), S = c.integer("S"), D = c.integer("D");
  const int64_t C = c.integer("C"), P = c.integer("P"), K = c.integer("K");
  const DType T = c.dtype("T"), TC = c.dtype("TC");
  auto query = c.read("query", bytes_of(T, B * H * S * D));
  auto key = c.read("key", bytes_of(T, B * N * S * D));
  auto value = c.read("value", bytes_of(T, B * N * S * D));
  auto key_cache = c.read("key_cache", bytes_of(TC, B * N * C * D));
  auto value_cache = c.read("value_cache", bytes_of(TC, B * N * C * D));
  auto past = c.read("past_lens", 4 * B), total = c.read("total_lens", 4 * B);
  std::vector<char> indices;
  if (K > 0) indices = c.read("block_indices", 4 * B * N * S * K);
  const int64_t num_blocks = (C + P - 1) / P;
  std::vector<char> output(bytes_of(T, B * S * H * D));
  std::vector<float> importance(B * N * num_blocks);
  quest::SparseBlockAttentionParams p;
  p.batch = B, p.num_heads = H, p.kv_heads = N, p.query_len = S, p.head_dim = D, p.capacity = C;
  p.block_size = P, p.num_blocks = num_blocks, p.top_k = K, p.scale = c.real("scale"), p.softcap = c.real("softcap");
  p.past_lens = reinterpret_cast<const int32_t*>(past.data());
  p.total_lens = reinterpret_cast<const int32_t*>(total.data());
  p.block_indices = indices.empty() ? nullptr : reinterpret_cast<const int32_t*>(indices.data());
  p.activation_type = T, p.cache_type = TC, p.query = query.data(), p.key = key.data(), p.value = value.data();
  p.key_cache = key_cache.data(), p.value_cache = value_cache.data(), p.output = output.data();
  p.block_importance = importance.data();
  k.write_cache_tokens(p, 0, B * N);
  k.sparse_block_attention(p, 0, B * N);
  c.write(k.isa, "output", output.data(), output.size());
  c.write(k.isa, "key_cache_out", key_cache.data(), key_cache.size());
  c.write(k.isa, "value_cache_out", value_cache.data(), value_cache.size());
  c.write(k.isa, "block_importance", importance.data(), importance.size() * 4);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CASE_DIR\n", argv[0]);
    return 2;
  }
  try {
    const Case c = load_case(argv[1]);
    const std::string op = c.text("op");
    for (const quest::KernelTable* table : quest::supported_kernels()) {
      if (op == "QuestMetadata")
        run_metadata(c, *table);
      else if (op == "SparseBlockSelect")
        run_select(c, *table);
      else if (op == "SparseBlockAttention")
        run_attention(c, *table);
      else
        throw std::runtime_error("unknown op " + op);
      std::printf("%s\n", table->isa);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quest_kernel_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
