// A few tokens times float16 weights, in fp32: the multiply a compiled CPU decode step spends its time in.
//
// specdec::half_linear(x, packed, bias, out_features) returns x @ W.T (+ bias) for the fp32 activations x
// (rows, K) and a weight matrix W (out_features, K) whose values are float16 numbers, stored packed by
// `pack_half` (half_weights.py): blocks of 16 output columns, each block laid out k-major (K rows of 16
// float16), so one block is one contiguous stream. Each weight is loaded once per pass of up to a dozen
// tokens, widened to fp32 in a register (F16C) and multiplied into every token's sums (FMA), which stay in
// registers for the whole K loop: the register-blocked micro-kernel of any GEMM, written for the skinny case a
// decode step or a verification has (1 to a few dozen rows) and for half-width weights. The products are exact
// fp32 products of the same values; only the order of the fp32 sums differs from another kernel's.
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "half_matmul.cpp needs an x86 CPU with AVX2, FMA and F16C (compiled with -march=native)"
#endif
#include <immintrin.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t kBlock = 16;  // output columns per packed block: one vector of 16 fp32 sums per token

// One token's 16 sums: a single 512-bit register where the CPU has AVX-512, else two 256-bit ones (AVX2).
#if defined(__AVX512F__)
struct Sums {
  __m512 v;
};
constexpr int kRegistersPerSums = 1;
constexpr int kMaxTokens = 12;  // 12 sums + a weight vector + a broadcast fit the 32 vector registers
inline Sums zero() { return {_mm512_setzero_ps()}; }
inline Sums load_half(const uint16_t* w) {  // 16 float16 weights, widened
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)))};
}
inline Sums multiply_add(const float* x, const Sums& w, const Sums& acc) {
  return {_mm512_fmadd_ps(_mm512_set1_ps(*x), w.v, acc.v)};
}
inline Sums add(const Sums& a, const Sums& b) { return {_mm512_add_ps(a.v, b.v)}; }
inline void store(float* out, const Sums& s) { _mm512_storeu_ps(out, s.v); }
#else
struct Sums {
  __m256 lo, hi;
};
constexpr int kRegistersPerSums = 2;
constexpr int kMaxTokens = 6;  // 12 registers of sums + 2 of weights + a broadcast fit the 16 vector registers
inline Sums zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Sums load_half(const uint16_t* w) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 8)))};
}
inline Sums multiply_add(const float* x, const Sums& w, const Sums& acc) {
  const __m256 b = _mm256_broadcast_ss(x);
  return {_mm256_fmadd_ps(b, w.lo, acc.lo), _mm256_fmadd_ps(b, w.hi, acc.hi)};
}
inline Sums add(const Sums& a, const Sums& b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline void store(float* out, const Sums& s) {
  _mm256_storeu_ps(out, s.lo);
  _mm256_storeu_ps(out + 8, s.hi);
}
#endif

// Independent chains of sums a core needs in flight to hide a multiply-add's latency (about 4 cycles, 2 per
// cycle): few tokens give few chains, so each token then keeps U sets of sums over interleaved k.
constexpr int kChains = 8;
template <int T>
constexpr int interleave() {
  return kChains / (T * kRegistersPerSums) > 1 ? kChains / (T * kRegistersPerSums) : 1;
}

// y[t, 0:width] = sum_k x[t, k] * w[k, 0:16] (+ bias) for T tokens, U sets of sums per token.
template <int T, int U>
void block_kernel(const float* x, int64_t ldx, const uint16_t* w, int64_t K, const float* bias, float* y,
                  int64_t ldy, int64_t width) {
  // Every loop over the sums is unrolled, so the compiler keeps them in registers: with a rolled loop left
  // (the epilogue's), GCC kept the array on the stack and stored all of it every k, a third of the speed.
  Sums acc[U][T];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) acc[u][t] = zero();
  const int64_t main_k = K - K % U;
  for (int64_t k = 0; k < main_k; k += U) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const Sums wk = load_half(w + (k + u) * kBlock);
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) acc[u][t] = multiply_add(x + t * ldx + k + u, wk, acc[u][t]);
    }
  }
  for (int64_t k = main_k; k < K; ++k) {
    const Sums wk = load_half(w + k * kBlock);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) acc[0][t] = multiply_add(x + t * ldx + k, wk, acc[0][t]);
  }
  float out[kBlock];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    Sums sum = acc[0][t];
#pragma GCC unroll 8
    for (int u = 1; u < U; ++u) sum = add(sum, acc[u][t]);
    store(out, sum);
    for (int64_t j = 0; j < width; ++j)  // the last block may be narrower than 16
      y[t * ldy + j] = bias ? out[j] + bias[j] : out[j];
  }
}

// One pass of `tokens` (1 to T) rows: the kernel compiled for exactly that many.
template <int T>
void block_pass(int tokens, const float* x, int64_t ldx, const uint16_t* w, int64_t K, const float* bias,
                float* y, int64_t ldy, int64_t width) {
  if constexpr (T > 1) {
    if (tokens < T) return block_pass<T - 1>(tokens, x, ldx, w, K, bias, y, ldy, width);
  }
  block_kernel<T, interleave<T>()>(x, ldx, w, K, bias, y, ldy, width);
}

// Tokens [0, rows) of one block, in passes of at most kMaxTokens.
void block_rows(const float* x, int64_t ldx, int64_t rows, const uint16_t* w, int64_t K, const float* bias,
                float* y, int64_t ldy, int64_t width) {
  for (int64_t r = 0; r < rows; r += kMaxTokens) {
    const int tokens = static_cast<int>(std::min<int64_t>(kMaxTokens, rows - r));
    block_pass<kMaxTokens>(tokens, x + r * ldx, ldx, w, K, bias, y + r * ldy, ldy, width);
  }
}

at::Tensor half_linear(const at::Tensor& input, const at::Tensor& packed,
                       const std::optional<at::Tensor>& bias_input, int64_t out_features) {
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kFloat,
              "half_linear: x must be fp32 (rows, in_features)");
  const at::Tensor x = input.contiguous();  // a compiled graph may hand over a strided view
  const std::optional<at::Tensor> bias = bias_input ? std::optional(bias_input->contiguous()) : std::nullopt;
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kHalf && packed.is_contiguous() &&
                  packed.size(2) == kBlock && packed.size(1) == x.size(1) &&
                  packed.size(0) * kBlock >= out_features,
              "half_linear: packed must be pack_half's (blocks, in_features, 16) float16 layout of the weight");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == out_features),
              "half_linear: bias must be fp32 (out_features,)");
  const int64_t rows = x.size(0), K = x.size(1), blocks = packed.size(0);
  at::Tensor y = at::empty({rows, out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::Half>());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Split the output columns between threads; a block of a small layer is only a few kB of weights, so
  // each thread takes several.
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t width = std::min(kBlock, out_features - b * kBlock);
      block_rows(xp, K, rows, wp + b * K * kBlock, K, bp ? bp + b * kBlock : nullptr, yp + b * kBlock,
                 out_features, width);
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specdec, m) {
  m.def("half_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("half_linear", &half_linear); }
