#pragma once
// The rendezvous: how the ranks of a job, started as separate processes, find each other and
// agree on one secret — rank 0's NCCL unique id — before a communicator exists (torchrun's
// env:// and file:// init methods).
//
// - TCP (MASTER_ADDR, MASTER_PORT): rank 0 listens on the port; every other rank connects
//   (retrying while rank 0 is not up yet), says who it is (rank, world size, run id) and
//   receives the blob. Rank 0 checks that each rank comes once and agrees on the world size and
//   run id, and returns once all world_size-1 have been served.
// - a shared file (KILN_RENDEZVOUS_FILE): rank 0 writes the blob beside it and renames it into
//   place (readers never see half a file); the others poll until the file holds the blob of
//   their run (KILN_RUN_ID, which scripts/kiln-run sets fresh for every launch, so a file left by
//   an earlier job is never read as this one's).
// Both end with a DistributedError naming the rank, the address or file and what was missing
// when the timeout passes.
#include <string>

#include "kiln/core/duration.hpp"
#include "kiln/core/linkage.hpp"

namespace kiln::distributed {

/// Where and as whom a process meets the others.
struct RendezvousConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       ///< the process's index on its machine (its GPU)
  std::string file;         ///< a shared file: used when set
  std::string master_addr;  ///< else rank 0's host
  int master_port = 0;      ///< and port
  std::string run_id;       ///< the launch this process belongs to (KILN_RUN_ID)
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// The configuration torchrun's env:// gives: RANK, WORLD_SIZE (required), LOCAL_RANK (default:
/// RANK), KILN_RENDEZVOUS_FILE, else MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (then
/// required), KILN_RUN_ID. ValueError naming the variable when one is missing or malformed.
KILN_ENTRY RendezvousConfig rendezvous_from_env(std::chrono::milliseconds timeout = std::chrono::minutes(10));

/// Rank 0's `blob` on every rank: rank 0 passes it (and gets it back once every rank has it);
/// the others pass anything and receive it.
KILN_ENTRY std::string share_from_rank0(const RendezvousConfig& config, const std::string& blob);

}  // namespace kiln::distributed
