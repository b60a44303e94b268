# Network and runtime environment for llama-1b-efa (efa interconnect).
# Each value says why it is set. Override per recipe with network.env or env.
# abort the process group on a collective error or hang instead of waiting for the time limit
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# warnings only; INFO floods logs and belongs to debugging (network.debug: true)
export NCCL_DEBUG=WARN
# libfabric's EFA provider (with the aws-ofi-nccl plugin)
export FI_PROVIDER=efa
# GPUDirect RDMA over EFA on p4d/p5
export FI_EFA_USE_DEVICE_RDMA=1
# data-loader workers fork; keep libfabric fork-safe
export FI_EFA_FORK_SAFE=1
# avoids ENOMEM when processes fork
export FI_EFA_USE_HUGE_PAGE=0
# bootstrap over a real host interface, never docker/loopback/veth
export NCCL_SOCKET_IFNAME='^docker,lo,veth'
# cpus_per_task / ranks per node = 192/8: no oversubscribed cores
export OMP_NUM_THREADS=24
# NCCL flight recorder: keep each rank's last collectives (a few MB of host memory)
export TORCH_NCCL_TRACE_BUFFER_SIZE=2000
# NCCL flight recorder: dump them when a collective times out
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
# NCCL flight recorder: one dump per rank in the run directory (torch appends the rank)
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$RUN_DIR"/ranks/nccl-trace/rank_
# cluster profile 'aws-efa' network_env
export LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/opt/aws-ofi-nccl/lib:/usr/local/cuda/lib64"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
