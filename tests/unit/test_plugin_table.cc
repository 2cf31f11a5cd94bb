// The plugin table holds every exported function: the library is loaded with
// dlopen as a host would, each name of tests/exported_symbols.txt resolved
// with dlsym, and each must be a member of the table flashspec_get_api returns
// (flashspec_get_api itself excepted), with no member left over.
//
// Usage: test_plugin_table LIBRARY EXPORTED_SYMBOLS_TXT
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "flashspec.h"

namespace {

std::string g_library, g_symbols;

std::vector<std::string> exported_names() {
  std::ifstream in(g_symbols);
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) names.push_back(line);
  return names;
}

TEST(PluginTable, HoldsEveryExportedFunction) {
  void* lib = dlopen(g_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using GetApi = const flashspec_api* (*)(unsigned);
  auto get_api = reinterpret_cast<GetApi>(dlsym(lib, "flashspec_get_api"));
  ASSERT_NE(get_api, nullptr);
  const flashspec_api* api = get_api(FLASHSPEC_ABI_VERSION);
  ASSERT_NE(api, nullptr);
  ASSERT_EQ(api->struct_size, sizeof(flashspec_api));

  // After struct_size and abi_version, the table is function pointers only.
  constexpr size_t kHeader = 2 * sizeof(uint32_t);
  static_assert((sizeof(flashspec_api) - kHeader) % sizeof(void (*)()) == 0, "only function pointers follow");
  const size_t members = (sizeof(flashspec_api) - kHeader) / sizeof(void (*)());
  std::multiset<void*> table;
  for (size_t i = 0; i < members; ++i) {
    void* member = nullptr;
    std::memcpy(&member, reinterpret_cast<const char*>(api) + kHeader + i * sizeof(void*), sizeof member);
    EXPECT_NE(member, nullptr) << "member " << i << " is NULL";
    table.insert(member);
  }

  const std::vector<std::string> names = exported_names();
  ASSERT_FALSE(names.empty()) << "no names read from " << g_symbols;
  size_t listed = 0;
  for (const std::string& name : names) {
    if (name == "flashspec_get_api") continue;
    void* symbol = dlsym(lib, name.c_str());
    ASSERT_NE(symbol, nullptr) << name << ": " << dlerror();
    EXPECT_EQ(table.count(symbol), 1u) << name << " is not in the plugin table exactly once";
    ++listed;
  }
  EXPECT_EQ(members, listed) << "the table and the exported functions differ in number";
  dlclose(lib);
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s LIBRARY EXPORTED_SYMBOLS_TXT\n", argv[0]);
    return 2;
  }
  g_library = argv[1];
  g_symbols = argv[2];
  return RUN_ALL_TESTS();
}
