// ptcoord's flags and what they become: the CoordinatorOptions and TLS a
// Coordinator and its servers start with. Every flag, and every file a flag
// names, is checked before anything is served; a refused flag names itself.
// Part of the ptcoord binary (main.cc wires it).
#ifndef PTRAIN_COORDINATOR_OPTIONS_H_
#define PTRAIN_COORDINATOR_OPTIONS_H_

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"

namespace ptrain {

// The flags as given (docs/control-plane.md, `ptcoord --help`).
struct PtcoordFlags {
  std::string listen = "127.0.0.1:7070";
  std::string state_dir = "ptcoord-state";
  std::string token_file, users_file;
  double audit_max_mb = 64;
  double preempt_grace_s = 120;
  double fairshare_half_life_h = 24 * 7;
  int audit_keep = 5;
  std::string ptworker, mpirun = "mpirun", work_root, advertise;
  std::string log_level = "info";
  std::vector<std::string> data_roots;
  std::string checkpoint_root;
  int local_slots = static_cast<int>(std::thread::hardware_concurrency());
  int local_gpus = -1;
  double grace_s = 10;
  double orphan_grace_s = 600;
  double retain_ended_days = 30;
  std::string metrics_listen;
  std::string ui_listen;
  bool ui_insecure = false;
  std::string join_token_file;
  bool require_node_approval = false;
  double node_timeout_s = 15;
  std::string launcher, slurm_partition, slurm_account, slurm_extra;
  double slurm_node_grace_s = 30;
  std::string ptrsh, cluster_network;
  std::string planner_profile;
  std::string tls_cert, tls_key, tls_client_ca, tls_ca;
};

// Declares every flag on `app`, bound to `flags`, with its help text.
void AddFlags(CLI::App& app, PtcoordFlags& flags);

// Why ptcoord does not start: it prints "ptcoord: error: MESSAGE" and exits
// with `exit_code`: 2 for a bad flag or a file a flag names, 1 when the
// state dir or a server cannot be set up.
struct Refusal {
  std::string message;
  int exit_code = 2;
};

// The options and TLS `flags` describe, each checked: TLS files parse and
// pair, token files load, the state dir is created and private (its user
// token generated when --token-file is not given), data roots resolve,
// ptworker and ptrsh exist, --launcher and --require-node-approval fit
// --join-token-file. Warns on
// stderr when it would serve plain text on an address that is not loopback.
std::optional<Refusal> OptionsFromFlags(const PtcoordFlags& flags,
                                        CoordinatorOptions* options,
                                        ServerTls* tls);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_OPTIONS_H_
