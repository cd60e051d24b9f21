# slurm.conf lines slurm-elastico relies on (tested with Slurm 22.05 and 24.11).
# Merge them into your slurm.conf. Lines marked "(site)" are examples to adapt.
# `elastico cluster up` writes a complete file of this kind for a one-host test
# cluster; compare with its etc/slurm.conf under the cluster's state dir.

# GPUs and their MPS shares are generic resources; MPS needs select/cons_tres.
GresTypes=gpu,mps
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory

# Reshaping a running job is: signal, checkpoint, `scontrol requeuehold`,
# `scontrol update Gres=mps:N`, `StartTime=now`, `release`. That needs requeue.
JobRequeue=1
# Seconds between SIGTERM and SIGKILL of a requeued or cancelled job: the
# elastico-run wrapper must finish its checkpoint inside it. (site)
KillWait=60
# Let nodes that were down come back by themselves once their slurmd registers.
ReturnToService=2
SchedulerType=sched/backfill

# Accounting: GRES appear in TRES strings only when listed (this needs slurmdbd;
# without it the line is fatal), and job comments, where elastico records the
# shape a job ran with, are stored only with job_comment. `elastico report`
# computes MPS share-hours from both.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageTRES=gres/gpu,gres/mps
AccountingStoreFlags=job_comment

# Nodes: Gres= must agree with gres.conf. mps = shares per GPU x GPUs; with 100
# shares per GPU, --gres=mps:25 gives a job CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25.
# Set gpu.shares_per_gpu in elastico.yaml to the same shares per GPU.
NodeName=gpu[01-04] CPUs=64 RealMemory=512000 Gres=gpu:4,mps:400 State=UNKNOWN
PartitionName=gpu Nodes=gpu[01-04] Default=YES MaxTime=INFINITE State=UP
