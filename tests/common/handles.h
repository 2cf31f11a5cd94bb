// Owning handles for the tests: each deleter is the library's destroy call.
#pragma once

#include <memory>

#include "flashspec.h"

namespace fstest {

struct ContextDeleter {
  void operator()(flashspec_context* c) const { flashspec_context_destroy(c); }
};
struct HeadDeleter {
  void operator()(flashspec_lm_head* h) const { flashspec_lm_head_destroy(h); }
};
struct SummariesDeleter {
  void operator()(flashspec_summaries* s) const { flashspec_summaries_destroy(s); }
};
struct DrafterDeleter {
  void operator()(flashspec_drafter* d) const { flashspec_drafter_destroy(d); }
};
struct EngineDeleter {
  void operator()(flashspec_engine* e) const { flashspec_engine_destroy(e); }
};
using ContextPtr = std::unique_ptr<flashspec_context, ContextDeleter>;
using HeadPtr = std::unique_ptr<flashspec_lm_head, HeadDeleter>;
using SummariesPtr = std::unique_ptr<flashspec_summaries, SummariesDeleter>;
using DrafterPtr = std::unique_ptr<flashspec_drafter, DrafterDeleter>;
using EnginePtr = std::unique_ptr<flashspec_engine, EngineDeleter>;

}  // namespace fstest
