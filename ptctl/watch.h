// ptctl watch (and submit --watch): follows a job until it ends, with a
// progress line on stderr, through coordinator restarts.
#ifndef PTRAIN_PTCTL_WATCH_H_
#define PTRAIN_PTCTL_WATCH_H_

#include <string>

#include "ptctl/connection.h"

namespace ptrain::ptctl {

// Follows job `id` until it ends, printing "ID STATE" then; 0 when it
// SUCCEEDED, kExitCancelled when CANCELLED, else kExitFailed (or RpcError's
// code when ptcoord stays away). Ctrl-C stops watching (kExitInterrupted),
// saying that the job goes on.
int Watch(Client& client, const std::string& id);

}  // namespace ptrain::ptctl

#endif  // PTRAIN_PTCTL_WATCH_H_
