// The FIA block table of SparseBlockAttention's NPU path (see attention_plan.h).
#include "attention_plan.h"

#include <algorithm>
#include <sstream>

namespace quest::cann {

std::string check_attention_support(const AttentionShape& s) {
  std::ostringstream why;
  const char* op = "SparseBlockAttention on CANN";
  if (s.activation_type != s.cache_type)
    why << op << ": query and caches must share one element type (FIA reads both as they are)";
  else if (s.cache_type == ElemType::F32)
    why << op << ": float32 caches are not supported by aclnnFusedInferAttentionScore; export with "
        << "--kv-dtype float16 (or bfloat16), or run the function-body graph";
  else if (s.block_size % 16 != 0 || s.block_size > kFiaMaxBlockSize)
    why << op << ": block_size P = " << s.block_size << " must be a multiple of 16 up to " << kFiaMaxBlockSize;
  else if (s.head_dim % 16 != 0 || s.head_dim > kFiaMaxHeadDim)
    why << op << ": head_dim D = " << s.head_dim << " must be a multiple of 16 up to " << kFiaMaxHeadDim;
  else if (s.capacity % s.block_size != 0)
    why << op << ": the cache capacity C = " << s.capacity << " must be a multiple of block_size P = " << s.block_size
        << " (the cache is read as pages of P tokens)";
  else if (s.num_heads / s.kv_heads > kFiaMaxGroup)
    why << op << ": " << s.num_heads / s.kv_heads << " query heads per KV head; FIA takes at most " << kFiaMaxGroup;
  else if (s.softcap != 0.0f)
    why << op << ": softcap is not supported by aclnnFusedInferAttentionScore";
  else if (s.wants_importance)
    why << op << ": the block_importance output is not produced on the NPU";
  else if (s.per_head_indices)
    why << op << ": block_indices has a row per query head (R = H); FIA's block table has one per KV head (R = N)";
  return why.str();
}

namespace {

// Queries [0, n) of row b attend exactly (every block up to their own).
int64_t exact_queries(int64_t b, int64_t S, const int32_t* past_lens, const int32_t* exact_lens) {
  if (exact_lens == nullptr) return 0;
  return std::clamp<int64_t>(static_cast<int64_t>(exact_lens[b]) - past_lens[b], 0, S);
}

}  // namespace

std::vector<RowRun> exact_select_rows(int64_t batch, int64_t rows_per_batch, int64_t query_len,
                                      const int32_t* past_lens, const int32_t* exact_lens) {
  std::vector<RowRun> runs;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t exact = exact_queries(b, query_len, past_lens, exact_lens);
    if (exact == 0) continue;
    for (int64_t r = 0; r < rows_per_batch; ++r) runs.push_back({(b * rows_per_batch + r) * query_len, exact});
  }
  return runs;
}

std::string check_chunk_support(const char* op, int64_t batch, int64_t query_len, const int32_t* past_lens,
                                const int32_t* total_lens, const int32_t* exact_lens, const int32_t* chunk_lens) {
  if (chunk_lens == nullptr) return "";
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = std::max<int64_t>(past_lens[b], exact_lens != nullptr ? exact_lens[b] : 0);
    const int64_t end = std::min<int64_t>({chunk_lens[b], total_lens[b], past_lens[b] + query_len});
    if (first < end)
      return std::string(op) + " on CANN: chunk queries (chunk_lens, a sparse prefill) have no NPU kernel; " +
             "prefill exactly (Generator(prefill=\"exact\")) or run the CPU ops";
  }
  return "";
}

FiaRows build_fia_rows(const AttentionShape& s, const int32_t* past_lens, const int32_t* total_lens,
                       const int32_t* indices, const int32_t* exact_lens) {
  const int64_t B = s.batch, N = s.kv_heads, S = s.query_len, P = s.block_size, M = s.capacity / P;
  bool any_exact = indices == nullptr;
  for (int64_t b = 0; b < B; ++b) any_exact = any_exact || exact_queries(b, S, past_lens, exact_lens) > 0;
  FiaRows out;
  out.rows = B * N * S;
  out.width = any_exact ? M : (s.top_k > 0 ? s.top_k : 1);
  out.table.assign(out.rows * out.width, 0);
  out.kv_lengths.assign(out.rows, 1);
  out.zero_output.assign(out.rows, 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      const int32_t first_page = static_cast<int32_t>((b * N + n) * M);
      for (int64_t i = 0; i < S; ++i) {
        const int64_t r = (b * N + n) * S + i, p = past_lens[b] + i;
        int32_t* row = out.table.data() + r * out.width;
        for (int64_t j = 0; j < out.width; ++j) row[j] = first_page;
        if (p >= total_lens[b]) {
          out.zero_output[r] = 1;
          continue;
        }
        const int64_t current = p / P;
        int64_t taken = 0, tokens = 0;
        auto take = [&](int64_t m) {
          if (m > current) return;  // a block after the query's own holds nothing it may attend
          row[taken++] = first_page + static_cast<int32_t>(m);
          tokens += m < current ? P : p + 1 - m * P;
        };
        if (indices && i >= exact_queries(b, S, past_lens, exact_lens)) {
          const int32_t* chosen = indices + r * s.top_k;  // validated: ascending is not required
          int64_t last = -1;
          for (int64_t pass = 0; pass < s.top_k; ++pass) {  // ascending order of the valid entries
            int64_t next = -1;
            for (int64_t j = 0; j < s.top_k; ++j)
              if (chosen[j] > last && (next < 0 || chosen[j] < next)) next = chosen[j];
            if (next < 0) break;
            take(next);
            last = next;
          }
        } else {
          for (int64_t m = 0; m <= current; ++m) take(m);
        }
        if (tokens == 0) {
          out.zero_output[r] = 1;
          continue;
        }
        out.kv_lengths[r] = tokens;
      }
    }
  }
  return out;
}

}  // namespace quest::cann
