"""Realistic GPU operation names and launch shapes (H100, bf16 transformer training).

Each kernel kind: (name, min_us, max_us, grid, block, registers/thread, shared mem,
weight).  Durations are drawn log-uniformly between min and max.
"""

from __future__ import annotations

NUM_SMS = 132

DEVICE_PROPERTIES = {
    "name": "NVIDIA H100 80GB HBM3",
    "totalGlobalMem": 85029158912,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": NUM_SMS,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
}

_EW_ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3>)"
)
_EW_MUL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, "
    "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
    "at::detail::Array<char*, 3>)"
)
_EW_COPY = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>("
    "at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
    "operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::"
    "{lambda(int)#1})"
)
_REDUCE = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
    "float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, "
    "float, float>, unsigned int, float, 4>)"
)
_SPLITK = (
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, "
    "false, false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, "
    "float const*, float const*, __nv_bfloat16 const*, float const*, __nv_bfloat16*, void*, long, float*, int*)"
)
_FLASH_FWD = (
    "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, "
    "false, false>(flash::Flash_fwd_params)"
)
_FLASH_BWD = (
    "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, "
    "2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, "
    "false, true, false, false, false, true, false, false>(flash::Flash_bwd_params)"
)
_FLASH_BWD_DOT = (
    "void flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, "
    "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >("
    "flash::Flash_bwd_params)"
)
_SOFTMAX = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
)

# name, min_us, max_us, grid, block, regs, smem, weight
FORWARD_KERNELS = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
     18, 160, (132, 1, 1), (384, 1, 1), 168, 213248, 8),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
     20, 180, (132, 1, 1), (384, 1, 1), 168, 213248, 5),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNT", 15, 140, (132, 1, 1), (384, 1, 1), 168, 205824, 4),
    (_FLASH_FWD, 40, 320, (16, 32, 8), (128, 1, 1), 255, 49152, 3),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 4, 30, (8192, 1, 1), (512, 1, 1), 40, 0, 5),
    ("triton_poi_fused_mul_silu_1", 3, 25, (65536, 1, 1), (128, 1, 1), 24, 0, 5),
    ("triton_per_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_2", 4, 28, (8192, 1, 1), (256, 1, 1), 38, 0, 2),
    (_EW_ADD, 2, 14, (32768, 1, 1), (128, 1, 1), 26, 0, 4),
    (_EW_COPY, 2, 18, (16384, 1, 1), (128, 1, 1), 32, 0, 2),
    (_REDUCE, 3, 20, (1024, 1, 1), (32, 16, 1), 40, 16, 1),
    (_SOFTMAX, 6, 60, (4096, 1, 1), (1024, 1, 1), 32, 0, 1),
    (_SPLITK, 2, 12, (256, 8, 1), (32, 16, 1), 30, 0, 1),
]

BACKWARD_KERNELS = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
     20, 180, (132, 1, 1), (384, 1, 1), 168, 213248, 8),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
     20, 190, (132, 1, 1), (384, 1, 1), 168, 213248, 6),
    ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", 15, 150, (132, 1, 1), (384, 1, 1), 168, 205824, 3),
    (_FLASH_BWD, 80, 520, (8, 32, 8), (256, 1, 1), 255, 98304, 3),
    (_FLASH_BWD_DOT, 4, 24, (64, 32, 8), (128, 1, 1), 40, 0, 2),
    ("triton_red_fused__to_copy_add_mul_pow_sum_3", 5, 35, (8192, 1, 1), (512, 1, 1), 48, 0, 4),
    ("triton_poi_fused_add_fill_mul_sigmoid_silu_sub_4", 3, 28, (65536, 1, 1), (128, 1, 1), 28, 0, 4),
    ("triton_per_fused__fused_rms_norm_backward_5", 5, 32, (8192, 1, 1), (256, 1, 1), 44, 0, 2),
    (_EW_MUL, 2, 16, (32768, 1, 1), (128, 1, 1), 26, 0, 4),
    (_EW_ADD, 2, 14, (32768, 1, 1), (128, 1, 1), 26, 0, 3),
    (_SPLITK, 2, 12, (256, 8, 1), (32, 16, 1), 30, 0, 2),
]

NCCL_GRAPH_KERNELS = [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 15, 180, (16, 1, 1), (512, 1, 1), 96, 0, 4),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 220, (16, 1, 1), (512, 1, 1), 96, 0, 4),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 10, 120, (32, 1, 1), (640, 1, 1), 96, 0, 2),
]

SYMM_BARRIER = ("void c10d::symmetric_memory::barrier_kernel(unsigned int**, unsigned long, unsigned long, unsigned long)",
                2, 7, (1, 1, 1), (8, 1, 1), 16, 0, 1)
SYMM_ALLREDUCE = (
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 4>(c10::BFloat16*, unsigned long, "
    "unsigned long, unsigned int**, unsigned long, unsigned long)",
    8, 45, (132, 1, 1), (1024, 1, 1), 64, 0, 1)

# Eager (non-graph) NCCL kernels, by collective.
NCCL_SENDRECV = ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", (1, 1, 1), (640, 1, 1), 96)
NCCL_ALLGATHER = ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", (16, 1, 1), (512, 1, 1), 96)
NCCL_REDUCESCATTER = ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                      (16, 1, 1), (512, 1, 1), 96)
NCCL_ALLREDUCE = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", (2, 1, 1), (640, 1, 1), 96)
NCCL_BROADCAST = ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                  (2, 1, 1), (640, 1, 1), 80)

# Optimizer (eager): (cpu op or None for a Triton launch via the driver API, kernel name, grid, block, regs)
MULTI_TENSOR = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<{n}>, at::native::(anonymous namespace)::{functor}<float, float>, "
    "std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<{n}>, "
    "at::native::(anonymous namespace)::{functor}<float, float>, std::multiplies<float>, float)"
)
OPTIMIZER_STEPS = [
    ("aten::_foreach_mul_", MULTI_TENSOR.format(n=2, functor="BinaryOpScalarFunctor"), (320, 1, 1), (512, 1, 1), 32),
    ("aten::_foreach_addcmul_", MULTI_TENSOR.format(n=3, functor="PointwiseOpScalarFunctor"), (320, 1, 1), (512, 1, 1), 40),
    (None, "triton_poi_fused__foreach_copy_0", (2048, 1, 1), (256, 1, 1), 30),
    ("aten::_foreach_add_", MULTI_TENSOR.format(n=2, functor="BinaryOpScalarFunctor"), (320, 1, 1), (512, 1, 1), 32),
    (None, "triton_per_fused__foreach_div_lerp_sqrt_1", (2048, 1, 1), (256, 1, 1), 36),
]

MEMCPY_DTOD = "Memcpy DtoD (Device -> Device)"
MEMCPY_HTOD = "Memcpy HtoD (Pinned -> Device)"
MEMCPY_DTOH = "Memcpy DtoH (Device -> Pinned)"
MEMSET = "Memset (Device)"

LAYER_PARTS = ("attention_norm", "attention", "ffn_norm", "feed_forward")

# CUPTI callback ids (runtime / driver API).
CBID_MEMCPY_ASYNC = 41
CBID_MEMSET_ASYNC = 51
CBID_STREAM_SYNC = 131
CBID_STREAM_WAIT_EVENT = 147
CBID_LAUNCH_KERNEL = 211
CBID_GRAPH_LAUNCH = 311
CBID_CU_LAUNCH_KERNEL = 307
