// SPDX-License-Identifier: Apache-2.0
/// `tessera serve --tp N --ep M` as one process per rank (docs/multi-gpu.md, "Serving"): taken when the launch
/// variables say WORLD_SIZE > 1 (dist/bootstrap.hpp). Every process joins the NCCL group, loads the CPU model
/// as host weights and builds its rank model (`--device cuda`: GpuDsv41Model::create_rank on its GPU, collectives
/// on device buffers; `--device cpu`: the CPU rank model, collectives staged through the GPU by
/// HostStagingCommunicator). Rank 0 serves HTTP with a RankDriver (models/common/rank_driver.hpp) over its
/// rank model; the others run `follow` until rank 0 shuts the group down. The command channel is a
/// HostStagingCommunicator over the same NcclCommunicator.
#pragma once

#include "servers/openai/serve.hpp"
#include "tessera/dist/bootstrap.hpp"
#include "tessera/dist/plan.hpp"

namespace tessera::cli {

/// Returns the process exit code. `c` is the serve configuration rank 0 serves with (its device "cpu" or
/// "cuda" picks the rank model); without NCCL in the build, a clear error and exit code 2.
int serve_ranks(server::ServeConfig c, dist::ParallelConfig cfg, dist::LaunchEnv const& env);

}  // namespace tessera::cli
