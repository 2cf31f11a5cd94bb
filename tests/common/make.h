// Checked creation of library objects for the GoogleTest suites: a failed
// create records a non-fatal failure with the library's message and returns
// an empty handle.
#pragma once

#include <gtest/gtest.h>

#include "context.h"
#include "flashspec.h"
#include "handles.h"

namespace fstest {

inline ContextPtr make_context(const ContextOptions& options) {
  flashspec_context* ctx = nullptr;
  flashspec_status s = create_context(options, &ctx);
  EXPECT_EQ(s, FLASHSPEC_OK) << flashspec_context_last_error(nullptr);
  return ContextPtr(ctx);
}

// An LM head over w (host or device memory); COPY unless flags say BORROW.
inline HeadPtr make_head(flashspec_context* ctx, const flashspec_tensor& w,
                         flashspec_lm_head_flags flags = FLASHSPEC_LM_HEAD_COPY) {
  flashspec_lm_head* head = nullptr;
  flashspec_status s = flashspec_lm_head_create(ctx, &w, flags, &head);
  EXPECT_EQ(s, FLASHSPEC_OK) << flashspec_context_last_error(ctx);
  return HeadPtr(head);
}

}  // namespace fstest
