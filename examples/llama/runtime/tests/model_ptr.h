// A loaded model freed at scope exit, for the runtime's tests; loading
// failures are test failures with the loader's message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "model.h"

struct ModelPtr {
  llama_model* model = nullptr;
  explicit ModelPtr(const std::string& path) {
    char err[512] = "";
    EXPECT_EQ(llama_model_load(path.c_str(), &model, err, sizeof err), 0) << err;
  }
  ~ModelPtr() { llama_model_free(model); }
  ModelPtr(const ModelPtr&) = delete;
  ModelPtr& operator=(const ModelPtr&) = delete;
};
