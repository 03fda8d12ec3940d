// gemm_sm90_kernel: C = epilogue(A @ W^T) on Hopper (sm_90a): TMA loads, wgmma, fp32 accumulation.
//
// Operands and epilogues as gemm.cu's gemm_kernel (A (M, K) and W (N, K) bf16, K-contiguous; gemm_epilogue.cuh),
// with two differences: A and W come as TMA tensor maps (the loader encodes them: 2-D bf16, box 64 x rows,
// 128-byte swizzle, zero fill past the edges), and `m_fastest` picks the tile order.
// Block: 1 producer warpgroup (one thread issues the TMA copies) + CONSUMERS warpgroups, each computing
// 64 rows x BN columns with wgmma m64nBNk16 (BN 8 .. 256); BM = 64 * CONSUMERS, BK = 64 (rows of 128 bytes), STAGES stages in shared memory, each KSTEPS k-steps of A and W tiles
// (KSTEPS > 1: one 3-D copy an operand a stage, see tma_load3), a full and an empty mbarrier per stage. Tile
// sizes are -D defines set by the loader.
// Tiles: tile t of ceil(M/BM) x ceil(N/BN) is (t % tiles_m, t / tiles_m) when m_fastest, else
// (t / tiles_n, t % tiles_n): consecutive tiles share a W tile (good when A is the smaller operand and stays
// in L2) or an A tile. Persistent: block b takes tiles b, b + gridDim.x, ...; the stages and their barriers
// run on across a block's tiles, so the producer loads the next tile while the consumers finish the last.
// Launch: block 128 * (CONSUMERS + 1) threads; grid (min(tiles, SMs)) (any grid works); dynamic shared memory
// STAGES * (BM + BN) * 128 * KSTEPS + 1024 bytes (1024 for the alignment the 128-byte swizzle needs).
// needed (null: every tile): a byte per tile, tiles_m x tiles_n; the tiles marked 0 are skipped, neither loaded
// nor computed (beam search's second top-k pass). thresh: EPILOGUE_TOPK's per-row thresholds (null: none).
// TMA_STORE (EPILOGUE_STORE, bf16 out, no residual; BN a multiple of 64): each consumer writes its 64 x BN
// part of the tile (bias and ReLU applied) into a buffer of its own in shared memory, as BN / 64 boxes of 64 x 64
// laid out as map_out's 128-byte swizzle, and one thread hands them to the TMA unit, which copies them out while
// the consumer goes on to its next tile. The stores from the fragments (16 bytes a row a quad) took ~11 us a
// tile that no product overlapped. map_out: `out`'s tensor map, box 64 x 64 (else unused).
// TMA_STORE 2 (f32 out onto its residual, in place: out is residual): the same with relu?(acc + bias) in f32,
// in two passes of BN / 2 columns (boxes of 32 x 64, map_out's box), which the TMA unit adds to out
// (cp.reduce.async.bulk.tensor .add): out = relu?(acc + bias) + residual, the register path's two adds in its
// order, rounded to nearest, subnormals flushed as --use_fast_math flushes them there.
// How the TMA_STORE epilogue leaves (kernels.STORE_OPTIONS picks; a 128 x 256 bf16 tile's epilogue ~2.4 -> ~1.4 us,
// docs/PERFORMANCE.md, "GEMM tiles"): STMATRIX (bf16) writes the fragments into shared memory by stmatrix, four 8 x 8
// matrices an instruction; EPI_CHUNKS splits a pass into chunks of whole boxes, each handed to the TMA unit as
// soon as it is written, while the next is; OUT_3D makes map_out 3-D (out seen as (N / box columns, M, box
// columns), box OUT_BOXES x 64 x box columns), so a chunk's boxes leave in one copy, not a copy a box;
// EPI_PASSES (bf16 1, f32 2 by default) more passes through a buffer as many times smaller, each pass's chunks
// written once the copies of the last pass's have read them, so that more stages fit beside the buffers.
// PDL: griddepcontrol.launch_dependents at the start and griddepcontrol.wait before any global memory is touched,
// so that launched as a programmatic dependent (launch.py) the launch and set-up overlap the kernel before.
// w_early (a runtime flag: W is constant) lets the producer load W's first stages before that wait.
// Each output sums its K products 16 at a time in increasing k, the order of gemm_kernel.
// FP8 (1; --compute-type float8): A (M, K) and W (N, K) are FP8 E4M3 codes (uint8, K-contiguous: FP8 wgmma takes
// both operands K-major), quantized per row with f32 scales a_scale (M,) and w_scale (N,) (kernels.quantize_rows,
// numerics.quantize_e4m3); their maps are 2-D uint8, box 128 x rows, the same 128-byte swizzle, so a stage holds
// the same bytes with twice the k (BK = 128), each 128-byte row taken by wgmma m64nBNk32 .e4m3 four times, 32
// bytes apart. Once a tile's products are summed (fp32 accumulators; the tensor cores add FP8 products with less
// precision than bf16's, tests/gpu/test_fp8_kernels.py says how much), each is scaled by a_scale[m] * w_scale[n],
// and every epilogue (bias, ReLU, residual, the logits' statistics) sees the scaled values. K % 16 == 0 (16-byte
// rows for TMA); the products are summed 32 at a time in increasing k.
#ifndef BN
#define BN 128
#define CONSUMERS 2
#define STAGES 5
#endif
#ifndef KSTEPS
#define KSTEPS 1
#endif
#ifndef FP8  // 1: A and W are FP8 E4M3 codes with a scale per row (a_scale, w_scale)
#define FP8 0
#endif
#ifndef TMA_STORE
#define TMA_STORE 0
#endif
#ifndef OUT_3D  // 1: map_out is 3-D, and a chunk's boxes leave in one copy (else a copy a box)
#define OUT_3D 0
#endif
#ifndef EPI_CHUNKS  // TMA_STORE: copies a pass, each out as soon as its part of the tile is in shared memory
#define EPI_CHUNKS 1
#endif
#ifndef STMATRIX  // 1 (bf16 out): the tile into shared memory by stmatrix, 8 x 8 matrices four at a time
#define STMATRIX 0
#endif
#if STMATRIX && TMA_STORE != 1
#error "STMATRIX is for bf16 out"
#endif
#ifndef PDL  // 1: griddepcontrol, so that launched as a programmatic dependent (kernels.py, launch.py) the launch and
#define PDL 0  // the set-up overlap the kernel before; no-ops in a plain launch
#endif
#ifndef OUT_BOXES  // OUT_3D: boxes a copy (map_out's third box dimension)
#define OUT_BOXES 1
#endif
#ifndef EPI_PASSES  // TMA_STORE: passes a tile leaves in, each through a buffer of BN / EPI_PASSES columns a consumer
#define EPI_PASSES (TMA_STORE == 2 ? 2 : 1)  // (more passes: a smaller buffer, so more stages fit beside it)
#endif
#define STAGING_BYTES (64 * (BN / EPI_PASSES) * (TMA_STORE == 2 ? 4 : 2))  // a consumer's buffer
#if TMA_STORE && (!defined(EPILOGUE_KIND) || EPILOGUE_KIND != 0 || BN % 64 != 0)
#error "TMA_STORE is for the store epilogue, a multiple of 64 columns"
#endif
#define BM (64 * CONSUMERS)  // the consumer warpgroups share a tile, 64 rows each; named barrier 1: their epilogue
#define ELEM_BYTES (FP8 ? 1 : 2)  // an operand element's bytes: E4M3 or bf16
#define BK (128 / ELEM_BYTES)     // k a stage's k-step: rows of 128 bytes, the 128-byte swizzle's
#define WGMMA_K (32 / ELEM_BYTES)  // k a wgmma: 32 bytes of each row (k16 bf16, k32 E4M3)
#define THREADS (128 * (CONSUMERS + 1))
#define WM 16
#define WN BN
#define MT 1
#define NT (BN / 8)
#define WARPS_N 1
#define EPI_THREADS (128 * CONSUMERS)
#define EPI_SYNC() asm volatile("bar.sync 1, %0;\n" ::"n"(EPI_THREADS))
#define STAGE_ELEMS ((BM + BN) * BK * KSTEPS)  // a stage: KSTEPS k-steps of A (BM x BK each) and of W (BN x BK)
#define STAGE_BYTES (STAGE_ELEMS * ELEM_BYTES)
#define EPI_SMEM_BYTES (STAGES * STAGE_BYTES)
#include "common.cuh"
#include "gemm_epilogue.cuh"
#if FP8
typedef unsigned char operand_t;  // E4M3 codes
#define WGMMA_OP(n) "{\nwgmma.mma_async.sync.aligned.m64n" n "k32.f32.e4m3.e4m3 {"
#define WGMMA_IMM "1, 1, 1;\n}\n"  // scale-d, scale-a, scale-b (FP8 has no transposes: both operands K-major)
#else
typedef __nv_bfloat16 operand_t;
#define WGMMA_OP(n) "{\nwgmma.mma_async.sync.aligned.m64n" n "k16.f32.bf16.bf16 {"
#define WGMMA_IMM "1, 1, 1, 0, 0;\n}\n"  // scale-d, scale-a, scale-b, transpose-a, transpose-b (K-major: none)
#endif

// A CUtensorMap made on the host, passed by value (a __grid_constant__ parameter the TMA unit reads in place).
struct __align__(64) TensorMap { unsigned long long bits[16]; };

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_expect_bytes(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// Copy the box at (column x, row y) of a 2-D tensor map into shared memory; completes on `bar`.
// KSTEPS > 1: a 3-D map of the array seen as (K / 64, rows, 64), box KSTEPS x rows x 64: KSTEPS k-steps of the
// 2-D box, one after another, in one copy. A stage's cost is mostly per copy and per stage, hardly per byte
// (docs/PERFORMANCE.md, "GEMM tiles": ~220 ns a stage of two 2-D boxes of any size; 4 k-steps in 3-D boxes 65 ns
// a k-step), so a tile of few rows loads several k-steps a stage.
__device__ __forceinline__ void tma_load3(void* dst, const TensorMap* map, int y, int z, unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(smem_addr(dst)), "l"((unsigned long long)map), "r"(0), "r"(y), "r"(z), "r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, int x, int y, unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(smem_addr(dst)), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(smem_addr(bar)) : "memory");
}

// Copy a box of shared memory to (column x, row y) of a 2-D tensor map (the parts past its edges are not written),
// or add it there (TMA_STORE 2).
__device__ __forceinline__ void tma_store(const TensorMap* map, const void* src, int x, int y) {
#if TMA_STORE == 2
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(smem_addr(src)), "r"(x), "r"(y) : "memory");
#else
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(smem_addr(src)), "r"(x), "r"(y) : "memory");
#endif
}

__device__ __forceinline__ void tma_store3(const TensorMap* map, const void* src, int y, int z) {
#if TMA_STORE == 2
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(smem_addr(src)), "r"(0), "r"(y), "r"(z) : "memory");
#else
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(smem_addr(src)), "r"(0), "r"(y), "r"(z) : "memory");
#endif
}

// wgmma shared-memory descriptor of a K-major tile with 128-byte rows, 128-byte swizzled: rows in groups of 8
// (1,024 bytes apart); the start address moves 32 bytes a wgmma (16 bf16 or 32 E4M3 columns of k).
__device__ __forceinline__ unsigned long long smem_desc(const void* p) {
    const unsigned long long addr = smem_addr(p);
    return ((addr & 0x3FFFF) >> 4) | ((16ull >> 4) << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// d (64 x N per warpgroup, fragments as gemm_epilogue.cuh) += A (64 x WGMMA_K) @ B (N x WGMMA_K)^T, both from shared
// memory.
// The asm names every accumulator: n8 chunk j of d is operands 4j .. 4j + 3.
#define ACC4(j) "+f"(d[0][j][0]), "+f"(d[0][j][1]), "+f"(d[0][j][2]), "+f"(d[0][j][3])
#define ACC16(j) ACC4(j), ACC4(j + 1), ACC4(j + 2), ACC4(j + 3)
#define ACC64(j) ACC16(j), ACC16(j + 4), ACC16(j + 8), ACC16(j + 12)
#define REGS_0_63 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define REGS_0_31 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31"
#define REGS_64_95 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, " \
    "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define REGS_64_127 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, " \
    "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, " \
    "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
    "%124, %125, %126, %127"

__device__ __forceinline__ void wgmma_n128(float (&d)[1][16][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("128") REGS_0_63 "}, %64, %65, " WGMMA_IMM
                 : ACC64(0)
                 : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ void wgmma_n256(float (&d)[1][32][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("256") REGS_0_63 ", " REGS_64_127 "}, %128, %129, " WGMMA_IMM
                 : ACC64(0), ACC64(16)
                 : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ void wgmma_n64(float (&d)[1][8][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("64") REGS_0_31 "}, %32, %33, " WGMMA_IMM
                 : ACC16(0), ACC16(4)
                 : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ void wgmma_n192(float (&d)[1][24][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("192") REGS_0_63 ", " REGS_64_95 "}, %96, %97, " WGMMA_IMM
                 : ACC64(0), ACC16(16), ACC16(20)
                 : "l"(desc_a), "l"(desc_b));
}

// Narrow tiles for few rows (64 x 8 .. 32, as cuBLAS's at 64 rows): many blocks share the work of one row tile.
__device__ __forceinline__ void wgmma_n8(float (&d)[1][1][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("8") "%0, %1, %2, %3}, %4, %5, " WGMMA_IMM
                 : ACC4(0)
                 : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ void wgmma_n16(float (&d)[1][2][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("16") "%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, " WGMMA_IMM
                 : ACC4(0), ACC4(1)
                 : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ void wgmma_n32(float (&d)[1][4][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(WGMMA_OP("32") "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, " WGMMA_IMM
                 : ACC4(0), ACC4(1), ACC4(2), ACC4(3)
                 : "l"(desc_a), "l"(desc_b));
}

#if BN == 8
#define WGMMA wgmma_n8
#elif BN == 16
#define WGMMA wgmma_n16
#elif BN == 32
#define WGMMA wgmma_n32
#elif BN == 64
#define WGMMA wgmma_n64
#elif BN == 128
#define WGMMA wgmma_n128
#elif BN == 192
#define WGMMA wgmma_n192
#elif BN == 256
#define WGMMA wgmma_n256
#else
#error "BN must be 8, 16, 32, 64, 128, 192 or 256"
#endif

// The producer's registers handed to the consumers (setmaxnreg): 65,536 a block, multiples of 8.
#define PRODUCER_REGISTERS 40
#define CONSUMER_REGISTERS ((65536 / 128 - PRODUCER_REGISTERS) / CONSUMERS / 8 * 8 > 256 ? 256 : (65536 / 128 - PRODUCER_REGISTERS) / CONSUMERS / 8 * 8)
#define SET_MAX_REGISTERS(op, n) asm volatile("setmaxnreg." #op ".sync.aligned.u32 %0;\n" ::"n"(n))

#if TMA_STORE
// TMA_STORE's epilogue, for one consumer warpgroup (tid 0..127 in it): relu?(acc + bias) in bf16 (or, TMA_STORE 2,
// f32, half the columns a pass) into `stage` (BN / 64 boxes of 8 KB, 64 rows of 128 bytes, 128-byte swizzled: a
// 16-byte chunk c of row r at chunk c ^ (r % 8), so a warp's writes fall in 32 different banks), then out to rows
// row0.., columns col0.. of map_out. The copy before must have read the buffer first. bias: 8-byte aligned, N
// even (the launcher's).
// bias_lane: the tile's bias, column col0 + lane + 32 i in element i of each lane (0 past N, or with no bias),
// loaded before the main loop: read here from global memory, the bias was half of the epilogue's stalls
// (docs/PERFORMANCE.md, "GEMM tiles"); each quad's columns come by shuffles.
__device__ __forceinline__ void store_through_smem(const float (&acc)[MT][NT][4], unsigned char* stage,
                                                   const TensorMap* map_out, int tid, int consumer, int row0,
                                                   int col0, const float (&bias_lane)[BN / 32], int relu) {
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int PASSES = EPI_PASSES, PASS_COLS = BN / PASSES, BOX_COLS = TMA_STORE == 2 ? 32 : 64;
    constexpr int CHUNK_COLS = PASS_COLS / EPI_CHUNKS, CHUNK_J = CHUNK_COLS / 8;  // a chunk: whole boxes
    static_assert(CHUNK_COLS % BOX_COLS == 0, "EPI_CHUNKS must split a pass into whole boxes");
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass) {
#pragma unroll
        for (int chunk_i = 0; chunk_i < EPI_CHUNKS; ++chunk_i) {
            // this chunk's buffer was last stored EPI_CHUNKS copies ago (every pass, of every tile, makes EPI_CHUNKS)
            if (tid == 0) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(EPI_CHUNKS - 1) : "memory");
            asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer));
            const int j0 = pass * NT / PASSES + chunk_i * CHUNK_J;
#if STMATRIX  // bf16: 8 x 8 matrices from the fragments, four an instruction (a j pair's two row halves)
#pragma unroll
            for (int j = j0; j < j0 + CHUNK_J; j += 2) {
                unsigned packed[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {  // matrix q: column block j + q / 2, rows + 8 (q % 2)
                    const int jj = j + q / 2, half = q % 2, col = jj * 8 + (lane & 3) * 2;
                    const float2 b = make_float2(__shfl_sync(0xffffffffu, bias_lane[jj / 4], col % 32),
                                                 __shfl_sync(0xffffffffu, bias_lane[jj / 4], col % 32 + 1));
                    float v0 = acc[0][jj][half * 2] + b.x, v1 = acc[0][jj][half * 2 + 1] + b.y;
                    if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
                    const __nv_bfloat162 h2 = __floats2bfloat162_rn(v0, v1);
                    packed[q] = *reinterpret_cast<const unsigned*>(&h2);
                }
                // lane l gives the address of row l % 8 of matrix l / 8
                const int m = lane >> 3, row = warp * 16 + (m & 1) * 8 + (lane & 7), at = (j + (m >> 1)) * 8 - pass * PASS_COLS;
                const int box = at / BOX_COLS, chunk = (at % BOX_COLS) / 8;
                asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                             ::"r"(smem_addr(stage + box * 8192 + row * 128 + ((chunk ^ (row & 7)) * 16))),
                             "r"(packed[0]), "r"(packed[1]), "r"(packed[2]), "r"(packed[3]) : "memory");
            }
#else
#pragma unroll
            for (int j = j0; j < j0 + CHUNK_J; ++j) {
                const int col = j * 8 + (lane & 3) * 2;  // in the tile
                const float2 b = make_float2(__shfl_sync(0xffffffffu, bias_lane[j / 4], col % 32),
                                             __shfl_sync(0xffffffffu, bias_lane[j / 4], col % 32 + 1));
                const int at = col - pass * PASS_COLS, box = at / BOX_COLS, chunk = (at % BOX_COLS) * (TMA_STORE == 2 ? 4 : 2) / 16;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = warp * 16 + (lane >> 2) + half * 8;
                    float v0 = acc[0][j][half * 2] + b.x, v1 = acc[0][j][half * 2 + 1] + b.y;
                    if (relu) { v0 = fmaxf(v0, 0.f); v1 = fmaxf(v1, 0.f); }
                    unsigned char* p = stage + box * 8192 + row * 128 + ((chunk ^ (row & 7)) * 16);
#if TMA_STORE == 2
                    *reinterpret_cast<float2*>(p + (at % 4) * 4) = make_float2(v0, v1);
#else
                    *reinterpret_cast<__nv_bfloat162*>(p + (at % 8) * 2) = __floats2bfloat162_rn(v0, v1);
#endif
                }
            }
#endif
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the writes, seen by the TMA unit
            asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer));
            if (tid == 0) {
                const int first_box = chunk_i * CHUNK_COLS / BOX_COLS, col = col0 + pass * PASS_COLS + chunk_i * CHUNK_COLS;
#if OUT_3D  // one copy: map_out is the array seen as (N / BOX_COLS, M, BOX_COLS), boxes CHUNK_COLS / BOX_COLS x 64 x BOX_COLS
                tma_store3(map_out, stage + first_box * 8192, row0, col / BOX_COLS);
#else
#pragma unroll
                for (int box = 0; box < CHUNK_COLS / BOX_COLS; ++box)
                    tma_store(map_out, stage + (first_box + box) * 8192, col + box * BOX_COLS, row0);
#endif
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            }
        }
    }
}
#endif

#if FP8
// acc (a warp's 16 rows from row0 and BN columns from col0, fragments as gemm_epilogue.cuh) times a_scale[row] *
// w_scale[column]. The scales are loaded before the tile's main loop (load_scales), so that their latency hides
// under it: a_lane the lane's two rows' scales, w_lane the tile's column col0 + lane + 32 i in element i of each
// lane (as bias_lane), shuffled to the lanes that hold it. Rows and columns past M and N (TMA's zeros) are scaled
// by 0.
__device__ __forceinline__ void load_scales(float (&a_lane)[2], float (&w_lane)[(BN + 31) / 32],
                                            const float* __restrict__ a_scale, const float* __restrict__ w_scale,
                                            int row0, int col0, int lane, int M, int N) {
    const int m0 = row0 + (lane >> 2), m1 = m0 + 8;
    a_lane[0] = m0 < M ? a_scale[m0] : 0.f;
    a_lane[1] = m1 < M ? a_scale[m1] : 0.f;
#pragma unroll
    for (int i = 0; i < (BN + 31) / 32; ++i) {  // (BN < 32: lanes past the tile load a column they never give)
        const int col = col0 + lane + 32 * i;
        w_lane[i] = col < N ? w_scale[col] : 0.f;
    }
}

__device__ __forceinline__ void scale_products(float (&acc)[MT][NT][4], const float (&a_lane)[2],
                                               const float (&w_lane)[(BN + 31) / 32], int lane) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int col = j * 8 + (lane & 3) * 2;  // in the tile
        const float2 sw = make_float2(__shfl_sync(0xffffffffu, w_lane[j / 4], col % 32),
                                      __shfl_sync(0xffffffffu, w_lane[j / 4], col % 32 + 1));
        acc[0][j][0] *= a_lane[0] * sw.x, acc[0][j][1] *= a_lane[0] * sw.y;
        acc[0][j][2] *= a_lane[1] * sw.x, acc[0][j][3] *= a_lane[1] * sw.y;
    }
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_sm90_kernel(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_w,
                 const __grid_constant__ TensorMap map_out,
                 const float* __restrict__ bias, const float* __restrict__ residual,
                 void* __restrict__ out, float* __restrict__ part_val, int* __restrict__ part_idx,
                 int M, int N, int K, int relu, int epilogue, int out_f32, float* __restrict__ part_stat, int m_fastest,
                 const float* __restrict__ thresh, const unsigned char* __restrict__ needed, int w_early,
                 const unsigned* __restrict__ noise
#if FP8
                 , const float* __restrict__ a_scale, const float* __restrict__ w_scale
#endif
                 ) {
    extern __shared__ __align__(1024) unsigned char gemm_smem[];
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
    unsigned char* base = gemm_smem + ((1024 - (smem_addr(gemm_smem) & 1023)) & 1023);
    operand_t* As = reinterpret_cast<operand_t*>(base);  // STAGES x BM x BK, swizzled
    operand_t* Ws = As + STAGES * BM * BK * KSTEPS;      // STAGES x KSTEPS x BN x BK, swizzled
    const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN), tiles = tiles_m * tiles_n;
    const int warpgroup = threadIdx.x / 128, k_tiles = CEIL_DIV(K, BK * KSTEPS);  // stages a tile
#define TILE_M(t) (m_fastest ? (t) % tiles_m : (t) / tiles_n)
#define TILE_N(t) (m_fastest ? (t) / tiles_m : (t) % tiles_n)
#define SKIPPED(t) (needed && !needed[TILE_M(t) * tiles_n + TILE_N(t)])

#if PDL  // launched as a programmatic dependent: let the next kernel's launch begin, and wait for the kernel before
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // (no-ops when launched without the attribute)
#endif
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);            // the producer's arrival, plus the copies' bytes
            mbar_init(&empty[s], CONSUMERS);  // one arrival per consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
#if KSTEPS > 1
#define LOAD_A(s, t, kt) tma_load3(As + (s) * BM * BK * KSTEPS, &map_a, TILE_M(t) * BM, (kt) * KSTEPS, &full[s])
#define LOAD_W(s, t, kt) tma_load3(Ws + (s) * BN * BK * KSTEPS, &map_w, TILE_N(t) * BN, (kt) * KSTEPS, &full[s])
#else
#define LOAD_A(s, t, kt) tma_load(As + (s) * BM * BK, &map_a, (kt) * BK, TILE_M(t) * BM, &full[s])
#define LOAD_W(s, t, kt) tma_load(Ws + (s) * BN * BK, &map_w, (kt) * BK, TILE_N(t) * BN, &full[s])
#endif
    // w_early (the caller's word that no kernel writes W: the engine's weights): W's first stages are loaded before
    // the wait for the kernel before, under its tail (that kernel let this one launch early: PDL); A, its output,
    // after. Each such stage's barrier already has its arrival and its bytes to expect.
    int early = 0;  // the block's first k-steps whose W is in flight before the wait (the producer thread's)
    if (w_early && !needed && threadIdx.x == 0 && (int)blockIdx.x < tiles) {
        early = k_tiles < STAGES ? k_tiles : STAGES;
        for (int kt = 0; kt < early; ++kt) {
            mbar_expect_bytes(&full[kt], STAGE_BYTES);  // whole boxes count, zero-filled parts too
            LOAD_W(kt, (int)blockIdx.x, kt);
        }
    }
#if PDL
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the kernel before is done, its writes seen
#endif

    if (warpgroup == 0) {  // producer
        SET_MAX_REGISTERS(dec, PRODUCER_REGISTERS);
        if (threadIdx.x == 0) {
            int it = 0;  // k-steps issued over all of this block's tiles
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                if (SKIPPED(t)) continue;
                for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);  // consumers are done with it
                    if (it >= early) {
                        mbar_expect_bytes(&full[s], STAGE_BYTES);
                        LOAD_W(s, t, kt);
                    }
                    LOAD_A(s, t, kt);
                }
            }
        }
        return;
    }

    SET_MAX_REGISTERS(inc, CONSUMER_REGISTERS);
    const int consumer = warpgroup - 1;
    const int tid = threadIdx.x - 128;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        if (SKIPPED(t)) continue;
#if TMA_STORE
        float bias_lane[BN / 32];  // for the epilogue, loaded while the main loop runs
#pragma unroll
        for (int i = 0; i < BN / 32; ++i) {
            const int col = TILE_N(t) * BN + tid % 32 + 32 * i;
            bias_lane[i] = bias && col < N ? bias[col] : 0.f;
        }
#endif
#if FP8
        float a_lane[2], w_lane[(BN + 31) / 32];  // the products' scales, loaded while the main loop runs
        load_scales(a_lane, w_lane, a_scale, w_scale, TILE_M(t) * BM + consumer * 64 + (tid % 128) / 32 * 16,
                    TILE_N(t) * BN, tid % 32, M, N);
#endif
        float acc[MT][NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.f;
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            const operand_t* a = As + s * BM * BK * KSTEPS + consumer * 64 * BK;
            const operand_t* w = Ws + s * BN * BK * KSTEPS;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
                for (int kk = 0; kk < BK; kk += WGMMA_K)
                    WGMMA(acc, smem_desc(a + ks * BM * BK + kk), smem_desc(w + ks * BN * BK + kk));
            wgmma_commit();
            wgmma_wait<1>();  // the previous step's products are done: hand its stage back
            if (kt > 0 && tid % 128 == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
        }
        wgmma_wait<0>();
        if (tid % 128 == 0) mbar_arrive(&empty[(it - 1) % STAGES]);  // the tile's last stage too
        const int tile_n = TILE_N(t);
#if FP8  // the codes' products back to the operands' scale, before any epilogue
        scale_products(acc, a_lane, w_lane, tid % 32);
#endif
#if TMA_STORE
        store_through_smem(acc, base + EPI_SMEM_BYTES + consumer * STAGING_BYTES, &map_out, tid % 128, consumer,
                           TILE_M(t) * BM + consumer * 64, tile_n * BN, bias_lane, relu);  // a buffer per consumer
#else
        // warp w of consumer c (warp_m = tid / 32 = 4c + w) holds tile rows 64c + 16w
        gemm_epilogue(acc, base, tid, tid / 32, 0, TILE_M(t) * BM, tile_n * BN, tile_n, tiles_n, bias, residual, out,
                      part_val, part_idx, part_stat, thresh, noise, M, N, relu, epilogue, out_f32);
#endif
    }
#if TMA_STORE
    if (tid % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the last copies are out
#endif
}
