// A fixed pool of worker threads running parallel_for over an index range.
// Work items are claimed dynamically, so results must not depend on which
// thread ran an item: callers write each item's output to its own slot.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashspec {

class ThreadPool {
 public:
  // Starts threads − 1 workers (the caller is the last). Throws
  // flashspec::Error (OUT_OF_MEMORY, Field::kCpuThreads) if the system
  // cannot start them all, with none left running.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Runs body(i) for i in [0, count), on the pool and the calling thread.
  // Rethrows the first exception a body threw, after all items finished.
  void parallel_for(int64_t count, const std::function<void(int64_t)>& body);

 private:
  void stop() noexcept;
  void worker_loop();
  void run_items();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t next_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace flashspec
