// Dynamically quantized INT8 GEMM: y = dequant(quant(x) . (weight - weight_zero_point)) [+ bias].
//
// Compiled at run time by NVRTC (plugins/kernels.py); plain CUDA C++ without includes. The arithmetic is the
// contract of plugins/reference.py, bit for bit: every float operation is an explicit round-to-nearest intrinsic
// (no contraction into FMA; the module is compiled with --fmad=false --ftz=false --prec-div=true as well), half
// values are converted with cvt (exact to float, round-to-nearest-even back), integer corrections wrap in 32 bits.
//
// Layouts (kernels.py builds them):
//   x        float32 or float16 [M, K], row-major (the plugin input, read-only)
//   q        int8 [M, Kp] quantized activations, Kp = K rounded up to 64, columns K..Kp-1 written as 0
//   rowsum   int32 [M]: the sum over k < K of q[m, k]
//   rowscale float32 [M] (token granularity): the row's scale
//   w        int8 [N, Kp]: the weight transposed (K contiguous), zero-padded
//   wzp      int32 [N] weight zero points; colcorr int32 [N] = sum_k w[k, n] - K * wzp[n]
//   y        float32 or float16 [M, N]
//
// granularity "tensor": codes = clamp(rint(x / s) + zp, 0, 255), stored as q = codes - 128 (int8), a = 128 - zp:
//   sum_k (codes - zp)(w - wzp) = q.w - wzp * rowsum + a * colcorr      (mod 2^32; the true value fits int32)
// granularity "token": q = clamp(rint(x / s_row), -127, 127), a = 0: sum_k q (w - wzp) = q.w - wzp * rowsum

typedef signed char i8;
typedef unsigned int u32;
typedef long long i64;

struct TensorParams {  // written by dq_tensor_params, read by the quantize and GEMM kernels
    float scale;
    int zero_point;
    int a;  // 128 - zero_point
    int unused;
};

#define MINMAX_THREADS 256
#define QUANT_ROWS 8  // rows per 256-thread block: one warp per row
#define K_TILE 64     // Kp is a multiple of this

__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float load_x(const void* x, int half, i64 i) {
    return half ? half_to_float(((const unsigned short*)x)[i]) : ((const float*)x)[i];
}

__device__ __forceinline__ int warp_sum(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide min and max (blockDim.x == MINMAX_THREADS); the result is valid in thread 0.
__device__ __forceinline__ void block_min_max(float& lo, float& hi) {
    __shared__ float slo[MINMAX_THREADS / 32], shi[MINMAX_THREADS / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    lo = warp_min(lo);
    hi = warp_max(hi);
    if (lane == 0) {
        slo[warp] = lo;
        shi[warp] = hi;
    }
    __syncthreads();
    if (warp == 0) {
        lo = lane < MINMAX_THREADS / 32 ? slo[lane] : 0.0f;
        hi = lane < MINMAX_THREADS / 32 ? shi[lane] : 0.0f;
        lo = warp_min(lo);
        hi = warp_max(hi);
    }
}

// Per-block min(0, min x) and max(0, max x) over all `count` elements: partial[2b], partial[2b + 1].
extern "C" __global__ void __launch_bounds__(MINMAX_THREADS)
dq_minmax_partial(const void* x, int half, i64 count, float* partial) {
    float lo = 0.0f, hi = 0.0f;  // min(0, .) and max(0, .) are part of the definition
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const bool aligned = ((unsigned long long)x & 15ull) == 0;
    i64 done = 0;
    if (!half && aligned) {
        const float4* v = (const float4*)x;
        const i64 nvec = count / 4;
        for (i64 i = first; i < nvec; i += stride) {
            const float4 f = v[i];
            lo = fminf(lo, fminf(fminf(f.x, f.y), fminf(f.z, f.w)));
            hi = fmaxf(hi, fmaxf(fmaxf(f.x, f.y), fmaxf(f.z, f.w)));
        }
        done = nvec * 4;
    } else if (half && aligned) {
        const uint4* v = (const uint4*)x;
        const i64 nvec = count / 8;
        for (i64 i = first; i < nvec; i += stride) {
            const uint4 u = v[i];
            const u32 words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float a = half_to_float((unsigned short)(words[j] & 0xffffu));
                const float b = half_to_float((unsigned short)(words[j] >> 16));
                lo = fminf(lo, fminf(a, b));
                hi = fmaxf(hi, fmaxf(a, b));
            }
        }
        done = nvec * 8;
    }
    for (i64 i = done + first; i < count; i += stride) {
        const float f = load_x(x, half, i);
        lo = fminf(lo, f);
        hi = fmaxf(hi, f);
    }
    block_min_max(lo, hi);
    if (threadIdx.x == 0) {
        partial[2 * blockIdx.x] = lo;
        partial[2 * blockIdx.x + 1] = hi;
    }
}

// One block: reduce the partials and derive the scale and zero point (onnxruntime's DynamicQuantizeLinear).
extern "C" __global__ void __launch_bounds__(MINMAX_THREADS)
dq_tensor_params(const float* partial, int blocks, TensorParams* params) {
    float lo = 0.0f, hi = 0.0f;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
        lo = fminf(lo, partial[2 * b]);
        hi = fmaxf(hi, partial[2 * b + 1]);
    }
    block_min_max(lo, hi);
    if (threadIdx.x == 0) {
        float s = __fdiv_rn(__fsub_rn(hi, lo), 255.0f);
        if (s == 0.0f) s = 1.0f;
        int zp = __float2int_rn(__fsub_rn(0.0f, __fdiv_rn(lo, s)));
        zp = min(max(zp, 0), 255);
        params->scale = s;
        params->zero_point = zp;
        params->a = 128 - zp;
        params->unused = 0;
    }
}

// Lane `lane` of a warp writes row `base`'s int8 values code(x) (0 beyond k, up to kp) packed four to a word, and
// the warp returns their sum (in every lane).
template <typename Code>
__device__ __forceinline__ int quantize_row(const void* x, int half, i64 base, int k, int kp, u32* out, int lane,
                                            Code code) {
    int sum = 0;
    for (int k4 = lane; k4 < kp / 4; k4 += 32) {
        u32 packed = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int kk = k4 * 4 + j;
            int v = 0;
            if (kk < k) {
                v = code(load_x(x, half, base + kk));
                sum += v;
            }
            packed |= ((u32)v & 0xffu) << (8 * j);
        }
        out[k4] = packed;
    }
    return warp_sum(sum);
}

// One warp per row: codes = clamp(rint(x / s) + zp, 0, 255), stored as codes - 128; the row sum of those.
extern "C" __global__ void __launch_bounds__(QUANT_ROWS * 32)
dq_quantize_tensor(const void* x, int half, i64 rows, int k, int kp, const TensorParams* params, i8* q,
                   int* rowsum) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * QUANT_ROWS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const float s = params->scale;
    const int zp = params->zero_point;
    const int sum = quantize_row(x, half, row * k, k, kp, (u32*)(q + row * kp), lane, [=](float v) {
        return min(max(__float2int_rn(__fdiv_rn(v, s)) + zp, 0), 255) - 128;
    });
    if (lane == 0) rowsum[row] = sum;
}

// One warp per row: s = max|x| / 127 (1 when 0), q = clamp(rint(x / s), -127, 127); the row sum and scale.
extern "C" __global__ void __launch_bounds__(QUANT_ROWS * 32)
dq_quantize_token(const void* x, int half, i64 rows, int k, int kp, i8* q, int* rowsum, float* rowscale) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * QUANT_ROWS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const i64 base = row * k;
    float amax = 0.0f;
    for (int kk = lane; kk < k; kk += 32) amax = fmaxf(amax, fabsf(load_x(x, half, base + kk)));
    amax = warp_max(amax);
    float s = __fdiv_rn(amax, 127.0f);
    if (s == 0.0f) s = 1.0f;
    const int sum = quantize_row(x, half, base, k, kp, (u32*)(q + row * kp), lane, [=](float v) {
        return min(max(__float2int_rn(__fdiv_rn(v, s)), -127), 127);
    });
    if (lane == 0) {
        rowsum[row] = sum;
        rowscale[row] = s;
    }
}

// The epilogue, shared by both GEMMs: integer corrections (mod 2^32), then float32 scaling and bias.
struct Epilogue {
    const int* rowsum;
    const float* rowscale;       // token granularity; null for tensor
    const TensorParams* params;  // tensor granularity; null for token
    const int* wzp;
    const int* colcorr;
    const float* wscale;
    const float* bias;  // may be null
    void* y;
    int half_out;
    i64 rows;
    int n;

    __device__ __forceinline__ void row_terms(i64 m, int& a, int& rs, float& scale) const {
        rs = rowsum[m];
        if (rowscale) {
            a = 0;
            scale = rowscale[m];
        } else {
            a = params->a;
            scale = params->scale;
        }
    }

    __device__ __forceinline__ void store(i64 m, int col, int acc, int a, int rs, float scale) const {
        const u32 exact = (u32)acc - (u32)wzp[col] * (u32)rs + (u32)a * (u32)colcorr[col];
        float out = __fmul_rn(__int2float_rn((int)exact), __fmul_rn(scale, wscale[col]));
        if (bias) out = __fadd_rn(out, bias[col]);
        const i64 at = m * n + col;
        if (half_out) {
            ((unsigned short*)y)[at] = float_to_half(out);
        } else {
            ((float*)y)[at] = out;
        }
    }
};

// ---------------------------------------------------------------------------------------------------------------
// dp4a GEMM (every architecture): 64x64 tile per 256-thread block, 4x4 outputs per thread, K in steps of 64.
#define DP_TILE 64
#define DP_WORDS (K_TILE / 4)

extern "C" __global__ void __launch_bounds__(256)
dq_gemm_dp4a(const i8* q, const i8* w, i64 rows, int n, int kp, const int* rowsum, const float* rowscale,
             const TensorParams* params, const int* wzp, const int* colcorr, const float* wscale,
             const float* bias, void* y, int half_out) {
    __shared__ int as[DP_TILE][DP_WORDS + 1];
    __shared__ int bs[DP_TILE][DP_WORDS + 1];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int n0 = blockIdx.x * DP_TILE;
    const i64 m0 = (i64)blockIdx.y * DP_TILE;
    const int lr = tid >> 2, lc = tid & 3;  // this thread loads 16 bytes of row lr of each tile
    const i64 am = min(m0 + lr, rows - 1);  // rows past the end repeat the last one; their results are dropped
    const int bn = min(n0 + lr, n - 1);
    const int4* ap = (const int4*)(q + am * kp) + lc;
    const int4* bp = (const int4*)(w + (i64)bn * kp) + lc;
    int acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0;
    for (int k0 = 0; k0 < kp; k0 += K_TILE) {
        const int4 av = ap[k0 / 16];
        const int4 bv = bp[k0 / 16];
        __syncthreads();
        as[lr][lc * 4 + 0] = av.x;
        as[lr][lc * 4 + 1] = av.y;
        as[lr][lc * 4 + 2] = av.z;
        as[lr][lc * 4 + 3] = av.w;
        bs[lr][lc * 4 + 0] = bv.x;
        bs[lr][lc * 4 + 1] = bv.y;
        bs[lr][lc * 4 + 2] = bv.z;
        bs[lr][lc * 4 + 3] = bv.w;
        __syncthreads();
#pragma unroll
        for (int kw = 0; kw < DP_WORDS; kw++) {
            int a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = as[ty + 16 * i][kw];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = bs[tx + 16 * j][kw];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = __dp4a(a[i], b[j], acc[i][j]);
        }
    }
    const Epilogue epi = {rowsum, rowscale, params, wzp, colcorr, wscale, bias, y, half_out, rows, n};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const i64 m = m0 + ty + 16 * i;
        if (m >= rows) continue;
        int a, rs;
        float scale;
        epi.row_terms(m, a, rs, scale);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int col = n0 + tx + 16 * j;
            if (col < n) epi.store(m, col, acc[i][j], a, rs, scale);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core GEMM (sm_80 and newer): mma.sync m16n8k32 s8 x s8 -> s32, cp.async multi-stage pipeline.
// A block has WM x WN warps, each computing (MT * 16) x (NT * 8) outputs; shared rows are padded to 80 bytes
// (conflict-free 32-bit fragment loads, 16-byte aligned cp.async destinations).
#define MMA_STAGES 3
#define MMA_LDS (K_TILE + 16)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DQ_HAS_MMA 1
#else
#define DQ_HAS_MMA 0
#endif

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if DQ_HAS_MMA
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if DQ_HAS_MMA
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if DQ_HAS_MMA
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void mma_s8(int* c, const int* a, const int* b) {
#if DQ_HAS_MMA
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <int WM, int WN, int MT, int NT>
__device__ __forceinline__ void gemm_mma(const i8* q, const i8* w, const int kp, const Epilogue& epi) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int BM = WM * MT * 16, BN = WN * NT * 8;
    constexpr int A_CHUNKS = BM * (K_TILE / 16) / THREADS, B_CHUNKS = BN * (K_TILE / 16) / THREADS;
    static_assert(A_CHUNKS * THREADS == BM * (K_TILE / 16), "A tile chunks");
    static_assert(B_CHUNKS * THREADS == BN * (K_TILE / 16), "B tile chunks");
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* const as = smem;                            // [MMA_STAGES][BM][MMA_LDS]
    unsigned char* const bs = smem + MMA_STAGES * BM * MMA_LDS;  // [MMA_STAGES][BN][MMA_LDS]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * BN;
    const i64 m0 = (i64)blockIdx.y * BM;
    const i64 rows = epi.rows;
    const int n = epi.n;

    const i8* asrc[A_CHUNKS];
    int adst[A_CHUNKS];
#pragma unroll
    for (int c = 0; c < A_CHUNKS; c++) {
        const int id = tid + c * THREADS, r = id >> 2, part = id & 3;
        asrc[c] = q + min(m0 + r, rows - 1) * kp + part * 16;
        adst[c] = r * MMA_LDS + part * 16;
    }
    const i8* bsrc[B_CHUNKS];
    int bdst[B_CHUNKS];
#pragma unroll
    for (int c = 0; c < B_CHUNKS; c++) {
        const int id = tid + c * THREADS, r = id >> 2, part = id & 3;
        bsrc[c] = w + (i64)min(n0 + r, n - 1) * kp + part * 16;
        bdst[c] = r * MMA_LDS + part * 16;
    }

    int acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0;

    const int ktiles = kp / K_TILE;
    auto load = [&](int stage, int kt) {
        unsigned char* sa = as + stage * BM * MMA_LDS;
        unsigned char* sb = bs + stage * BN * MMA_LDS;
#pragma unroll
        for (int c = 0; c < A_CHUNKS; c++) cp_async16(sa + adst[c], asrc[c] + kt * K_TILE);
#pragma unroll
        for (int c = 0; c < B_CHUNKS; c++) cp_async16(sb + bdst[c], bsrc[c] + kt * K_TILE);
    };
#pragma unroll
    for (int s = 0; s < MMA_STAGES - 1; s++) {
        if (s < ktiles) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();  // tile kt is visible to all; everyone is done with the stage the next load overwrites
        const int next = kt + MMA_STAGES - 1;
        if (next < ktiles) load(next % MMA_STAGES, next);
        cp_async_commit();
        const unsigned char* sa = as + (kt % MMA_STAGES) * BM * MMA_LDS + (wm * MT * 16 + g) * MMA_LDS + 4 * t;
        const unsigned char* sb = bs + (kt % MMA_STAGES) * BN * MMA_LDS + (wn * NT * 8 + g) * MMA_LDS + 4 * t;
#pragma unroll
        for (int ks = 0; ks < K_TILE; ks += 32) {
            int af[MT][4], bf[NT][2];
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const unsigned char* p = sa + i * 16 * MMA_LDS + ks;
                af[i][0] = *(const int*)p;
                af[i][1] = *(const int*)(p + 8 * MMA_LDS);
                af[i][2] = *(const int*)(p + 16);
                af[i][3] = *(const int*)(p + 8 * MMA_LDS + 16);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const unsigned char* p = sb + j * 8 * MMA_LDS + ks;
                bf[j][0] = *(const int*)p;
                bf[j][1] = *(const int*)(p + 16);
            }
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < NT; j++) mma_s8(acc[i][j], af[i], bf[j]);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < MT; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const i64 m = m0 + wm * MT * 16 + i * 16 + g + 8 * h;
            if (m >= rows) continue;
            int a, rs;
            float scale;
            epi.row_terms(m, a, rs, scale);
#pragma unroll
            for (int j = 0; j < NT; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = n0 + wn * NT * 8 + j * 8 + 2 * t + e;
                    if (col < n) epi.store(m, col, acc[i][j][2 * h + e], a, rs, scale);
                }
            }
        }
    }
}

#define DQ_MMA_KERNEL(NAME, WM, WN, MT, NT)                                                                      \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32)                                                   \
    NAME(const i8* q, const i8* w, i64 rows, int n, int kp, const int* rowsum, const float* rowscale,            \
         const TensorParams* params, const int* wzp, const int* colcorr, const float* wscale, const float* bias, \
         void* y, int half_out) {                                                                                \
        const Epilogue epi = {rowsum, rowscale, params, wzp, colcorr, wscale, bias, y, half_out, rows, n};      \
        if (DQ_HAS_MMA) gemm_mma<WM, WN, MT, NT>(q, w, kp, epi);                                                \
    }

// 128x128 tiles (8 warps of 64x32) for large problems; 64x64 tiles (4 warps of 32x32) to fill the GPU otherwise.
DQ_MMA_KERNEL(dq_gemm_mma_128x128, 2, 4, 4, 4)
DQ_MMA_KERNEL(dq_gemm_mma_64x64, 2, 2, 2, 4)
