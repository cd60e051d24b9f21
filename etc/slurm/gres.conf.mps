# gres.conf lines for MPS sharing with slurm-elastico (Slurm 22.05 and 24.11).
# Lines marked "(site)" are examples to adapt: node names, GPU type, devices.

# List the GPUs explicitly so the gpu and mps lines name the same devices.
# (AutoDetect=nvml also finds the GPUs, but the mps line below is still needed.)
AutoDetect=off
NodeName=gpu[01-04] Name=gpu Type=a100 File=/dev/nvidia[0-3]

# MPS shares. Count is split evenly over the File= devices: 400 over 4 GPUs is
# 100 shares per GPU, matching Gres=...,mps:400 in slurm.conf.
#
# Flags=all_sharing is essential. Without it MPS behaves as one_sharing (the
# MPS default): every MPS job is placed on GPU 0 and the others wait while
# GPUs 1-3 stay idle.
NodeName=gpu[01-04] Name=mps Count=400 File=/dev/nvidia[0-3] Flags=all_sharing

# Notes
# - Slurm only sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_VISIBLE_DEVICES;
#   the nvidia-cuda-mps-control daemon itself must run on each GPU node (for
#   example started by the node's Prolog or a systemd unit).
# - Slurm 22.05 lets a whole-GPU job (--gres=gpu:N) start on a GPU that MPS
#   jobs already use; 24.11 keeps it pending. elastico's planner keeps them
#   apart itself; do not rely on Slurm 22.05 for it.
