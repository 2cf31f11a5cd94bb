#include "engine/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "engine/callback_drafter.h"
#include "engine/host_call.h"
#include "util/busy_guard.h"
#include "util/status.h"

namespace flashspec {

BatchEngine::Slot::Slot(uint64_t id_, std::vector<Drafter*> drafters_, const BatchEngineConfig& config,
                        Metrics& totals, int64_t vocab)
    : id(id_),
      drafters(std::move(drafters_)),
      policy(make_policy(config.policy)),
      reward_scale(make_reward_scale(config.cost, config.arms, drafters)),
      metrics(int32_t(config.arms.size())),
      sequence(SequenceShared{&config.arms, &drafters, &config.cost, policy.get(), &reward_scale, &metrics,
                              &totals, vocab, config.max_context, config.adaptive_draft_len,
                              config.draft_len_memory, config.target_keep != nullptr}) {}

BatchEngine::BatchEngine(BatchEngineConfig config, LmHeadRunner& runner)
    : config_(std::move(config)),
      runner_(runner),
      vocab_(config_.target_head->vocab),
      hidden_(config_.target_head->hidden),
      metrics_(int32_t(config_.arms.size())) {}

void BatchEngine::add(uint64_t id, const int32_t* prompt, int32_t prompt_len, GenerateConfig config,
                      std::vector<Drafter*> drafters) {
  if (busy_) fail(FLASHSPEC_ERR_INTERNAL, "BatchEngine::add entered during a step");
  auto slot = std::make_unique<Slot>(id, std::move(drafters), config_, metrics_, vocab_);
  slot->sequence.begin(prompt, prompt_len, std::move(config), nullptr);
  slots_.push_back(std::move(slot));
}

bool BatchEngine::remove(uint64_t id) {
  if (busy_) fail(FLASHSPEC_ERR_INTERNAL, "BatchEngine::remove entered during a step");
  auto it = std::find_if(slots_.begin(), slots_.end(), [&](const auto& slot) { return slot->id == id; });
  if (it == slots_.end()) return false;
  // Cancelled: its tokens so far were streamed all the same.
  if ((*it)->active) finish(**it);
  slots_.erase(it);
  return true;
}

const BatchEngine::Slot* BatchEngine::find(uint64_t id) const {
  for (const auto& slot : slots_)
    if (slot->id == id) return slot.get();
  return nullptr;
}

void BatchEngine::finish(Slot& slot) {
  slot.active = false;
  slot.sequence.end();
}

void BatchEngine::end_with_error(Slot& slot, const Error& error) {
  slot.status = error.status();
  slot.error = error.what();
  slot.sequence.progress().finish_reason = FLASHSPEC_FINISH_NONE;
  finish(slot);
}

flashspec_tensor BatchEngine::forward_target() {
  ids_.clear();
  num_past_.clear();
  tokens_.clear();
  parents_.clear();
  token_offsets_.assign(1, 0);
  row_offsets_.assign(1, 0);
  bool trees = false;
  for (Slot* slot : stepping_) trees = trees || slot->sequence.tree();
  for (Slot* slot : stepping_) {
    ids_.push_back(slot->id);
    num_past_.push_back(slot->sequence.cache_length());
    slot->sequence.append_forward_tokens(tokens_, trees ? &parents_ : nullptr);
    token_offsets_.push_back(int32_t(tokens_.size()));
    row_offsets_.push_back(row_offsets_.back() + slot->sequence.drafted() + 1);
  }
  flashspec_batch_target_call call{};
  call.struct_size = sizeof(flashspec_batch_target_call);
  call.num_sequences = int32_t(stepping_.size());
  call.sequence_ids = ids_.data();
  call.num_past = num_past_.data();
  call.token_offsets = token_offsets_.data();
  call.tokens = tokens_.data();
  call.row_offsets = row_offsets_.data();
  call.num_tokens = int32_t(tokens_.size());
  call.num_rows = row_offsets_.back();
  call.step = step_count_;
  call.parents = trees ? parents_.data() : nullptr;
  call_host("target forward", [&] { return config_.target_forward(config_.target_user_data, &call); });
  check_callback_view(call.hidden, "target forward: hidden", runner_.memory(), call.num_rows, hidden_);
  return call.hidden;
}

void BatchEngine::verify(const flashspec_tensor& hidden) {
  requests_.clear();
  for (Slot* slot : stepping_) requests_.push_back(slot->sequence.verify_request(nullptr));
  accepted_.assign(stepping_.size(), -1);
  emitted_.assign(size_t(row_offsets_.back()), -1);
  accepted_nodes_.assign(size_t(row_offsets_.back()), -1);
  const BatchVerify batch{requests_.data(), int32_t(requests_.size()), &hidden, nullptr};
  FieldNames names{};
  names[size_t(Field::kHidden)] = "target forward: hidden";
  naming_fields(names, [&] {
    runner_.verify_batch(*config_.target_head, batch, accepted_.data(), emitted_.data(), accepted_nodes_.data());
  });
}

int32_t BatchEngine::step() {
  // The C API refuses a nested step before it gets here.
  if (busy_) fail(FLASHSPEC_ERR_INTERNAL, "BatchEngine::step entered during a step");
  BusyGuard busy(busy_);
  const auto start = std::chrono::steady_clock::now();

  // Draft for every active sequence; one whose drafter fails ends here.
  stepping_.clear();
  for (const auto& slot : slots_) {
    if (!slot->active) continue;
    if (slot->sequence.finished_before_step()) {
      finish(*slot);
      continue;
    }
    try {
      slot->sequence.draft(runner_);
      // The C API admits no stochastic drafter; a proposal with logits
      // cannot share the batch's one verify pass.
      if (slot->sequence.proposal().has_logits)
        fail(FLASHSPEC_ERR_UNSUPPORTED, "drafter: proposed draft logits, which a batched engine cannot verify");
    } catch (const Error& e) {
      end_with_error(*slot, e);
      continue;
    }
    stepping_.push_back(slot.get());
  }

  if (!stepping_.empty()) {
    // One forward and one verify for the batch; a failure of either leaves
    // every sequence's cache length as it was (the next forward's num_past
    // corrects the host's caches).
    const flashspec_tensor hidden = forward_target();
    verify(hidden);
    step_count_ += 1;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Each sequence on its own: rollback, delivery, finish.
    for (size_t s = 0; s < stepping_.size(); ++s) {
      Slot& slot = *stepping_[s];
      try {
        slot.sequence.forwarded();
        const int32_t* emitted = emitted_.data() + row_offsets_[s];
        const int32_t* nodes = accepted_nodes_.data() + row_offsets_[s];
        switch (slot.sequence.verified(accepted_[s], emitted, nodes)) {
          case CacheFix::kNone: break;
          case CacheFix::kRollback:
            if (config_.target_rollback) {
              const int32_t keep = slot.sequence.cache_length();
              call_host("target rollback",
                        [&] { return config_.target_rollback(config_.target_user_data, slot.id, keep); });
            }
            break;
          case CacheFix::kKeep: {
            const std::vector<int32_t>& keep = slot.sequence.keep();
            call_host("target keep", [&] {
              return config_.target_keep(config_.target_user_data, slot.id, slot.sequence.forward_past(),
                                         keep.data(), int32_t(keep.size()));
            });
            break;
          }
        }
        if (slot.sequence.deliver(seconds)) finish(slot);
      } catch (const Error& e) {
        end_with_error(slot, e);
      }
    }
  }
  // A sequence that used up its budget or context finishes now, not at
  // the next step, so the host sees it finished.
  int32_t active = 0;
  for (const auto& slot : slots_) {
    if (slot->active && slot->sequence.finished_before_step()) finish(*slot);
    if (slot->active) active += 1;
  }
  return active;
}

}  // namespace flashspec
