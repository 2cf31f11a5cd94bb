#include "util/thread_pool.h"

#include <string>

#include "util/status.h"

namespace flashspec {

ThreadPool::ThreadPool(int threads) {
  try {
    workers_.reserve(size_t(threads > 1 ? threads - 1 : 0));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::exception& e) {
    // The destructor does not run for a constructor that throws: stop the
    // workers that did start, so nothing is left running.
    const size_t started = workers_.size();
    stop();
    fail(FLASHSPEC_ERR_OUT_OF_MEMORY, Field::kCpuThreads,
         "cannot start " + std::to_string(threads - 1) + " worker threads (started " + std::to_string(started) +
             "): " + e.what());
  }
}

ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

void ThreadPool::run_items() {
  for (;;) {
    int64_t item;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= count_) return;
      item = next_++;
    }
    try {
      (*body_)(item);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      ++active_;
    }
    run_items();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --active_;
    }
    work_done_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t)>& body) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    next_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  work_ready_.notify_all();
  run_items();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [&] { return active_ == 0 && next_ >= count_; });
    body_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace flashspec
