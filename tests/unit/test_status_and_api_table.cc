// The ABI-visible constants: status numbers pinned forever, one distinct
// string and name per status, version queries equal to the macros, and the
// plugin table of flashspec_get_api complete for this ABI and absent for
// any other.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "flashspec.h"

namespace {

// The numbers are ABI: spelled out here, not taken from the table.
static_assert(FLASHSPEC_OK == 0, "pinned");
static_assert(FLASHSPEC_ERR_INVALID_ARGUMENT == 1, "pinned");
static_assert(FLASHSPEC_ERR_NULL_POINTER == 2, "pinned");
static_assert(FLASHSPEC_ERR_STRUCT_SIZE == 3, "pinned");
static_assert(FLASHSPEC_ERR_OUT_OF_RANGE == 4, "pinned");
static_assert(FLASHSPEC_ERR_DTYPE_MISMATCH == 5, "pinned");
static_assert(FLASHSPEC_ERR_DEVICE_MISMATCH == 6, "pinned");
static_assert(FLASHSPEC_ERR_NON_FINITE == 7, "pinned");
static_assert(FLASHSPEC_ERR_OUT_OF_MEMORY == 8, "pinned");
static_assert(FLASHSPEC_ERR_WORKSPACE_EXCEEDED == 9, "pinned");
static_assert(FLASHSPEC_ERR_UNSUPPORTED == 10, "pinned");
static_assert(FLASHSPEC_ERR_NO_DEVICE == 11, "pinned");
static_assert(FLASHSPEC_ERR_CUDA == 12, "pinned");
static_assert(FLASHSPEC_ERR_CALLBACK == 13, "pinned");
static_assert(FLASHSPEC_ERR_CANCELLED == 14, "pinned");
static_assert(FLASHSPEC_ERR_INTERNAL == 15, "pinned");
static_assert(sizeof(flashspec_status) == 4, "enums are 32-bit");

static_assert(FLASHSPEC_BACKEND_AUTO == 0 && FLASHSPEC_BACKEND_CPU == 1 && FLASHSPEC_BACKEND_CUDA == 2, "pinned");
static_assert(FLASHSPEC_DTYPE_F32 == 0 && FLASHSPEC_DTYPE_BF16 == 1 && FLASHSPEC_DTYPE_F16 == 2, "pinned");
static_assert(FLASHSPEC_MEMORY_HOST == 0 && FLASHSPEC_MEMORY_CUDA == 1, "pinned");
static_assert(FLASHSPEC_LM_HEAD_COPY == 0 && FLASHSPEC_LM_HEAD_BORROW == 1, "pinned");
static_assert(FLASHSPEC_RNG_DRAFT_NOISE == 1 && FLASHSPEC_RNG_ACCEPT_UNIFORM == 2 &&
                  FLASHSPEC_RNG_RESIDUAL_NOISE == 3 && FLASHSPEC_RNG_BONUS_NOISE == 4,
              "pinned: part of the randomness contract");

struct Row {
  flashspec_status status;
  int value;
  const char* name;
  const char* text;
};

const Row kTable[] = {
#define FLASHSPEC_TEST_ROW_(name, value, text) {FLASHSPEC_##name, value, "FLASHSPEC_" #name, text},
    FLASHSPEC_STATUS_TABLE(FLASHSPEC_TEST_ROW_)
#undef FLASHSPEC_TEST_ROW_
};

TEST(StatusTable, EveryValueHasItsPinnedNumberAndADistinctStringAndName) {
  EXPECT_EQ(sizeof(kTable) / sizeof(kTable[0]), 16u) << "a status was added or removed: pin its number above";
  std::set<std::string> texts, names;
  std::set<int> values;
  for (const Row& row : kTable) {
    EXPECT_EQ(int(row.status), row.value) << row.name;
    EXPECT_STREQ(flashspec_status_name(row.status), row.name);
    EXPECT_STREQ(flashspec_status_string(row.status), row.text) << row.name;
    EXPECT_STRNE(flashspec_status_string(row.status), "unknown status") << row.name;
    EXPECT_STRNE(flashspec_status_name(row.status), "FLASHSPEC_UNKNOWN_STATUS");
    EXPECT_GT(std::string(row.text).size(), 0u);
    texts.insert(row.text);
    names.insert(row.name);
    values.insert(row.value);
  }
  EXPECT_EQ(texts.size(), 16u) << "two statuses share a description";
  EXPECT_EQ(names.size(), 16u);
  EXPECT_EQ(values.size(), 16u);
  EXPECT_EQ(*values.begin(), 0);
  EXPECT_EQ(*values.rbegin(), 15);  // dense 0..15
}

TEST(StatusTable, UnknownValuesGetTheUnknownStrings) {
  for (int v : {16, -1, 1000, 0x7fffffff}) {
    EXPECT_STREQ(flashspec_status_string(flashspec_status(v)), "unknown status") << v;
    EXPECT_STREQ(flashspec_status_name(flashspec_status(v)), "FLASHSPEC_UNKNOWN_STATUS") << v;
  }
}

TEST(Version, QueriesMatchTheMacros) {
  EXPECT_EQ(flashspec_version_number(), unsigned(FLASHSPEC_VERSION_NUMBER));
  EXPECT_EQ(FLASHSPEC_VERSION_NUMBER,
            FLASHSPEC_VERSION_MAJOR * 10000 + FLASHSPEC_VERSION_MINOR * 100 + FLASHSPEC_VERSION_PATCH);
  char expected[32];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", FLASHSPEC_VERSION_MAJOR, FLASHSPEC_VERSION_MINOR,
                FLASHSPEC_VERSION_PATCH);
  EXPECT_STREQ(flashspec_version_string(), expected);
  EXPECT_EQ(flashspec_abi_version(), unsigned(FLASHSPEC_ABI_VERSION));
  // The SONAME's number is the ABI version, which is the major version here.
  EXPECT_EQ(FLASHSPEC_ABI_VERSION, FLASHSPEC_VERSION_MAJOR);
}

TEST(PluginTable, CompleteForThisAbi) {
  const flashspec_api* api = flashspec_get_api(FLASHSPEC_ABI_VERSION);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->struct_size, sizeof(flashspec_api));
  EXPECT_EQ(api->abi_version, unsigned(FLASHSPEC_ABI_VERSION));
  EXPECT_EQ(flashspec_get_api(FLASHSPEC_ABI_VERSION), api) << "the table is static";
  // Every member after the two header words is a function pointer; none
  // may be NULL, including members appended later.
  const size_t first = offsetof(flashspec_api, version_number);
  const size_t count = (sizeof(flashspec_api) - first) / sizeof(void (*)(void));
  ASSERT_EQ(first + count * sizeof(void (*)(void)), sizeof(flashspec_api));
  const unsigned char* base = reinterpret_cast<const unsigned char*>(api);
  for (size_t i = 0; i < count; ++i) {
    void (*fn)(void) = nullptr;
    std::memcpy(&fn, base + first + i * sizeof fn, sizeof fn);
    EXPECT_NE(fn, nullptr) << "member " << i << " of flashspec_api is NULL";
  }
  // The members are the functions they are named after.
  EXPECT_EQ(api->version_number, &flashspec_version_number);
  EXPECT_EQ(api->version_string, &flashspec_version_string);
  EXPECT_EQ(api->status_string, &flashspec_status_string);
  EXPECT_EQ(api->context_params_init, &flashspec_context_params_init);
  EXPECT_EQ(api->context_create, &flashspec_context_create);
  EXPECT_EQ(api->context_destroy, &flashspec_context_destroy);
  EXPECT_EQ(api->context_last_error, &flashspec_context_last_error);
  EXPECT_EQ(api->context_synchronize, &flashspec_context_synchronize);
  EXPECT_EQ(api->lm_head_create, &flashspec_lm_head_create);
  EXPECT_EQ(api->lm_head_destroy, &flashspec_lm_head_destroy);
  EXPECT_EQ(api->draft_params_init, &flashspec_draft_params_init);
  EXPECT_EQ(api->draft, &flashspec_draft);
  EXPECT_EQ(api->verify_batch_init, &flashspec_verify_batch_init);
  EXPECT_EQ(api->verify_result_init, &flashspec_verify_result_init);
  EXPECT_EQ(api->summaries_create, &flashspec_summaries_create);
  EXPECT_EQ(api->summaries_destroy, &flashspec_summaries_destroy);
  EXPECT_EQ(api->verify, &flashspec_verify);
  EXPECT_EQ(api->finalize, &flashspec_finalize);
  EXPECT_EQ(api->verify_and_finalize, &flashspec_verify_and_finalize);
}

TEST(PluginTable, AbsentForAnyOtherAbi) {
  for (unsigned v : {unsigned(FLASHSPEC_ABI_VERSION) + 1, unsigned(FLASHSPEC_ABI_VERSION) + 100, ~0u})
    EXPECT_EQ(flashspec_get_api(v), nullptr) << v;
}

}  // namespace
