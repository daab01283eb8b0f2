"""What was read of the world, as typed, pure data.

- The probe's output, one module per subject, each holding its facts' types, their pure parsers
  (raw in, fact out; tested on tests/facts_cases/*.json) and the `Part`s it declares, the Facts
  fields it fills and the probe output each reads: memory, kernel (host name, release, sysctls,
  page size), limits (rlimits, Docker's ulimits), network (interfaces, routes, the SSH address),
  rdma, docker, mounts, checkpoint_dir (the checkpoint's fingerprint on a rank), gpu (GPU, driver,
  clocks, CDI specs, nvidia-ctk), disks, clock, nccl_lib. parts: what a part is, FactError.
  record: the `Facts` record assembled from those parts and checked against its declared types,
  and the probe's invocation.
- Derived from a rank's Facts: fabric (its NCCL/UCX/GLOO pins and RoCE v2 GID), cabling (init's
  cabling from neighbour MACs), load_path (where a rank reads the checkpoint from), start_facts
  (what a later failure is compared with: the facts of a start, check/since_start.py compares them).
- The checkpoint's shape and weight split from `config.json` and the safetensors headers
  (checkpoint, safetensors_header); which of its files a rank hashes, the command and its parser
  (checkpoint_hashes); image references split into their parts (image_ref); the
  named facts `ship`, `build`, `serve` and `prep` read of a rank, each a shell command and its
  parser (remote).

Pure parsers and derivations: no SSH, no Docker (remote's commands are run by the caller).
May import `launcher.errors`, `launcher.status` (fabric's findings) and `launcher.onrank` (the
probe's invocation) only.
"""
