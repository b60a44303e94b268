# Network and runtime environment for rlhf-ppo (infiniband interconnect).
# Each value says why it is set. Override per recipe with network.env or env.
# abort the process group on a collective error or hang instead of waiting for the time limit
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# warnings only; INFO floods logs and belongs to debugging (network.debug: true)
export NCCL_DEBUG=WARN
# bootstrap over a real host interface, never docker/loopback/veth
export NCCL_SOCKET_IFNAME='^docker,lo,veth'
# longer IB verbs timeout (NCCL default 18) rides out fabric congestion on large jobs
export NCCL_IB_TIMEOUT=22
# GPUDirect RDMA when NIC and GPU share a PCIe host bridge
export NCCL_NET_GDR_LEVEL=PHB
# cpus_per_task / ranks per node = 96/8: no oversubscribed cores
export OMP_NUM_THREADS=12
# NCCL flight recorder: keep each rank's last collectives (a few MB of host memory)
export TORCH_NCCL_TRACE_BUFFER_SIZE=2000
# NCCL flight recorder: dump them when a collective times out
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
# NCCL flight recorder: one dump per rank in the run directory (torch appends the rank)
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$RUN_DIR"/ranks/nccl-trace/rank_
