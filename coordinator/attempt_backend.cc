// What a backend without nodes of its own does (attempt_backend.h): admits
// every job, never grows one back, cannot ask an attempt to stop, and has
// no node to wait for.
#include "coordinator/attempt_backend.h"

namespace ptrain {

absl::Status AttemptBackend::Admit(const v1::JobSpec& /*spec*/,
                                   int /*world*/) const {
  return absl::OkStatus();
}

int AttemptBackend::FreeSlotCount(const RunningJobs& /*running*/) const {
  return -1;
}

bool AttemptBackend::QueuesItself() const { return false; }

int AttemptBackend::TotalSlots() { return -1; }

ClusterShape AttemptBackend::Shape(const v1::JobSpec& /*spec*/) { return {}; }

std::string AttemptBackend::FreeSlots(const RunningJobs& /*running*/) const {
  return "more slots than are free";
}

bool AttemptBackend::FitsFullSize(const v1::Job& /*job*/,
                                  const RunningJobs& /*others*/) {
  return false;
}

std::string AttemptBackend::StartedEvent(const AttemptHandle& /*handle*/,
                                         v1::Attempt* /*attempt*/) const {
  return "";
}

bool AttemptBackend::CanAskToStop() const { return false; }

bool AttemptBackend::AskToStop(AttemptHandle& /*handle*/) { return false; }

bool AttemptBackend::AskToDump(AttemptHandle& /*handle*/,
                               const v1::Job& /*job*/,
                               const std::string& /*attempt_uid*/,
                               ProcessStates* /*seen*/) {
  return false;
}

std::string AttemptBackend::LostNode(const v1::Job& /*job*/,
                                     absl::Time /*now*/) {
  return "";
}

NodeVerdict AttemptBackend::CheckNodes(AttemptHandle& /*handle*/,
                                       const v1::Job& /*job*/,
                                       absl::Time /*ended_at*/,
                                       absl::Time /*now*/) {
  return NodeVerdict{"", /*all_heard=*/true};
}

absl::Duration AttemptBackend::NodeGrace() const {
  return absl::ZeroDuration();
}

}  // namespace ptrain
