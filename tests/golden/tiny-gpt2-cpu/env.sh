# Network and runtime environment for tiny-gpt2 (loopback interconnect).
# Each value says why it is set. Override per recipe with network.env or env.
# abort the process group on a collective error or hang instead of waiting for the time limit
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
# warnings only; INFO floods logs and belongs to debugging (network.debug: true)
export NCCL_DEBUG=WARN
# single machine: no InfiniBand
export NCCL_IB_DISABLE=1
# all 'nodes' share this machine's loopback interface
export NCCL_SOCKET_IFNAME=lo
# gloo (CPU) connects over loopback too
export GLOO_SOCKET_IFNAME=lo
# CPU-only nodes: DeepSpeed skips accelerator auto-detection
export DS_ACCELERATOR=cpu
# cpus_per_task / ranks per node = 2/2: no oversubscribed cores
export OMP_NUM_THREADS=1
