// Attention over the filled part of a static KV cache: what a compiled decode step should read, and no more.
//
// A static cache is preallocated to the run's whole length, so a compiled forward's keys and values are the
// whole buffer, and its mask hides the unused tail. Scaled dot-product attention still reads every slot of
// it: over the zoo target's 512-slot cache that is 16 MB of keys and values per step when 200 slots are
// filled, as many bytes as the weights themselves. The number of filled slots changes every step, so it
// cannot be a shape of the compiled graph; this op reads it from the mask instead, at run time.
//
// specdec::filled_attention(query, key, value, mask, scale) is softmax(scale * Q K^T + mask) V over the keys
// and values up to the last column that some row of the additive (or boolean) `mask` lets a query see,
// returned as (batch, queries, heads, head_dim), the layout the next projection reads. The columns cut are
// those every row hides: their weights are exactly zero after the softmax, so the result is the same attention
// (only the order of the fp32 sums may differ). Each query row of each head is `attend_one` below, a plain
// dot-product, softmax and weighted sum: for one row (a decode step) about two thirds of the cost of torch's
// general SDPA kernel, for the 6 to 12 rows of a verification about a third (whose setup, block buffers and
// threads are sized for long sequences, not for a dozen rows over 200 slots).
#if !defined(__AVX2__) || !defined(__FMA__)
#error "filled_attention.cpp needs an x86 CPU with AVX2 and FMA (compiled with -march=native)"
#endif
#include <immintrin.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// Whether mask value `m` hides its column: false for a boolean mask, the most negative value (or -inf) for an
// additive one.
template <typename T>
inline bool hides(T m) {
  return m == std::numeric_limits<T>::lowest() || m == -std::numeric_limits<T>::infinity();
}
template <>
inline bool hides<bool>(bool m) {
  return !m;
}

// One past the last column of `mask` (..., rows, columns) that some row does not hide (at least 1).
template <typename T>
int64_t filled_columns(const at::Tensor& mask) {
  const at::Tensor rows = mask.contiguous().view({-1, mask.size(-1)});
  const int64_t count = rows.size(0), columns = rows.size(1);
  const T* m = rows.data_ptr<T>();
  for (int64_t c = columns; c > 1; --c) {
    for (int64_t r = 0; r < count; ++r) {
      if (!hides(m[r * columns + c - 1])) return c;
    }
  }
  return 1;
}

// q . k for the four keys `stride` apart from `k`, into out[0:4] (dim a multiple of 8): four independent chains
// of multiply-adds, so that a core is not waiting on one (a single 64-float dot is latency-bound).
inline void dot4(const float* q, const float* k, int64_t stride, int64_t dim, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 x = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + stride + d), a1);
    a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 2 * stride + d), a2);
    a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 3 * stride + d), a3);
  }
  // Pairwise sums leave each key's total split between the two 128-bit halves, in key order.
  const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)));
}

// The sum of a vector's eight lanes.
inline float lane_sum(__m256 v) {
  float lanes[8];
  _mm256_storeu_ps(lanes, v);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// q . k over `dim` floats (a multiple of 8), for the last few keys.
inline float dot(const float* q, const float* k, int64_t dim) {
  __m256 a = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
  return lane_sum(a);
}

// e^x for eight floats x <= 0 (softmax's shifted scores), to about 1 ulp; exactly 0 below -87, where e^x is
// no longer a normal float (a hidden column's score is the most negative float, so its weight is exactly 0).
// The usual reduction: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its degree-6 Taylor-like minimax
// polynomial (Cephes' expf coefficients), then 2^n put into the exponent bits.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.0f);
  const __m256 vanishes = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_max_ps(x, low);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts: exact n * high
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(vanishes, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}

// out[0:8V] = inverse * sum_j weights[j] * values[j, 0:8V] over `filled` value rows `stride` apart: V vectors of
// sums stay in registers while each value row is read once.
template <int V>
inline void weighted_sum(const float* weights, const float* values, int64_t stride, int64_t filled,
                         __m256 inverse, float* out) {
  __m256 sums[V];
#pragma GCC unroll 8
  for (int i = 0; i < V; ++i) sums[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < filled; ++j) {
    const __m256 weight = _mm256_broadcast_ss(weights + j);
#pragma GCC unroll 8
    for (int i = 0; i < V; ++i) sums[i] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(values + j * stride + 8 * i), sums[i]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < V; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(sums[i], inverse));
}

// softmax(scale * q K^T + mask) V for one query over the first `filled` keys: keys and values are rows their
// strides apart, mask holds `filled` additive values, scores has room for `filled` floats rounded up to 8, out
// for value_dim (dim and value_dim multiples of 8). The weighted sum keeps eight vectors of sums in registers
// and reads each value row once.
void attend_one(const float* q, const float* keys, int64_t key_stride, const float* values,
                int64_t value_stride, const float* mask, int64_t filled, int64_t dim, int64_t value_dim,
                float scale, float* scores, float* out) {
  int64_t j = 0;
  for (; j + 4 <= filled; j += 4) dot4(q, keys + j * key_stride, key_stride, dim, scores + j);
  for (; j < filled; ++j) scores[j] = dot(q, keys + j * key_stride, dim);
  float top = -std::numeric_limits<float>::infinity();
  for (j = 0; j < filled; ++j) {
    scores[j] = scores[j] * scale + mask[j];
    top = std::max(top, scores[j]);
  }
  const int64_t padded = (filled + 7) / 8 * 8;
  std::fill(scores + filled, scores + padded, std::numeric_limits<float>::lowest());  // weight 0
  __m256 totals = _mm256_setzero_ps();
  for (j = 0; j < padded; j += 8) {
    const __m256 weight = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(top)));
    _mm256_storeu_ps(scores + j, weight);
    totals = _mm256_add_ps(totals, weight);
  }
  const __m256 inverse = _mm256_set1_ps(1.f / lane_sum(totals));
  for (int64_t d0 = 0; d0 < value_dim; d0 += 64) {  // eight vectors of sums at a time
    const float* chunk = values + d0;
    switch (std::min<int64_t>(64, value_dim - d0) / 8) {
      case 8: weighted_sum<8>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      case 7: weighted_sum<7>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      case 6: weighted_sum<6>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      case 5: weighted_sum<5>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      case 4: weighted_sum<4>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      case 3: weighted_sum<3>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      case 2: weighted_sum<2>(scores, chunk, value_stride, filled, inverse, out + d0); break;
      default: weighted_sum<1>(scores, chunk, value_stride, filled, inverse, out + d0); break;
    }
  }
}

// Every query row of every head: its own `attend_one`, the (batch, head, row) tasks split between threads
// where each gets enough work. A verification's rows share their keys and values, which stay in the L2 cache
// between rows (200 slots of one head are 100 kB).
at::Tensor attend_rows(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& mask, int64_t filled, double scale) {
  const int64_t batch = query.size(0), heads = query.size(1), rows = query.size(2), dim = query.size(3);
  const int64_t group = heads / key.size(1), value_dim = value.size(3);
  const at::Tensor q = query.contiguous();
  // The mask as it lies (broadcast over batch or heads: stride 0 there), its columns contiguous.
  const at::Tensor m = (mask.stride(3) == 1 ? mask : mask.contiguous()).expand({batch, heads, rows, mask.size(3)});
  // (batch, rows, heads, value_dim): the layout the output projection reads.
  at::Tensor out = at::empty({batch, rows, heads, value_dim}, query.options());
  const float *qp = q.data_ptr<float>(), *kp = key.data_ptr<float>(), *vp = value.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t work = std::max<int64_t>(1, filled * (dim + value_dim));  // multiply-adds per task
  at::parallel_for(0, batch * heads * rows, std::max<int64_t>(1, 32768 / work), [&](int64_t begin, int64_t end) {
    std::vector<float> scores((filled + 7) / 8 * 8);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (heads * rows), h = task / rows % heads, r = task % rows;
      attend_one(qp + task * dim, kp + b * key.stride(0) + (h / group) * key.stride(1), key.stride(2),
                 vp + b * value.stride(0) + (h / group) * value.stride(1), value.stride(2),
                 mp + b * m.stride(0) + h * m.stride(1) + r * m.stride(2), filled, dim, value_dim,
                 static_cast<float>(scale), scores.data(), op + ((b * rows + r) * heads + h) * value_dim);
    }
  });
  return out;
}

at::Tensor filled_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
              "filled_attention: query, key and value must be (batch, heads, length, head_dim)");
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
                  value.scalar_type() == at::kFloat,
              "filled_attention: query, key and value must be fp32");
  TORCH_CHECK(mask.dim() == 4 && mask.size(-1) == key.size(2),
              "filled_attention: mask must be (batch, 1 or heads, queries, keys) with one column per key");
  TORCH_CHECK(mask.scalar_type() == at::kFloat || mask.scalar_type() == at::kBool,
              "filled_attention: mask must be fp32 (additive) or boolean");
  TORCH_CHECK(key.size(3) == query.size(3) && value.size(2) == key.size(2) && query.size(1) % key.size(1) == 0,
              "filled_attention: keys and values must match the query's head_dim and each other's length, "
              "and the query heads must be a multiple of the key-value heads");
  const int64_t filled =
      mask.scalar_type() == at::kBool ? filled_columns<bool>(mask) : filled_columns<float>(mask);
  const at::Tensor keys = key.narrow(2, 0, filled), values = value.narrow(2, 0, filled);
  at::Tensor visible = mask.narrow(-1, 0, filled);
  const bool vectors = query.size(3) % 8 == 0 && value.size(3) % 8 == 0;
  if (keys.stride(3) != 1 || values.stride(3) != 1 || !vectors) {  // not a cache's layout: torch's kernel
    return at::scaled_dot_product_attention(query, keys, values, visible, 0.0, false, scale,
                                            query.size(1) != key.size(1))
        .transpose(1, 2)
        .contiguous();  // (batch, queries, heads, head_dim): a no-op for the flash kernel's layout
  }
  if (visible.scalar_type() == at::kBool) {
    visible = at::zeros(visible.sizes(), query.options())
                  .masked_fill_(visible.logical_not(), -std::numeric_limits<float>::infinity());
  }
  return attend_rows(query, keys, values, visible, filled, scale);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdec, m) {
  m.def("filled_attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("filled_attention", &filled_attention); }
