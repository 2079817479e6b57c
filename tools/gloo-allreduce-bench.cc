// gloo::allreduce timing in nccl-tests' terms, the same rows as
// tools/mpi-allreduce-bench.c, for comparing MetaRoCE's `metaroce
// coll-perf all_reduce` with Gloo (PyTorch's CPU collectives) over its TCP
// transport.
//
// usage: gloo-allreduce-bench RANK WORLD STORE_DIR MIN_BYTES MAX_BYTES FACTOR ITERS
//
// Every rank is started by hand (scripts/bench-allreduce.sh starts WORLD of
// them on 127.0.0.1); they meet through a file store in STORE_DIR (empty,
// shared by the ranks) and connect a full mesh of TCP pairs. For each size
// (float, sum, in place, Gloo's default algorithm: the ring): one warm-up
// call, a barrier, ITERS timed calls, the per-call time averaged over ranks
// (nccl-tests' -a 1), algbw = size / time and busbw = algbw * 2(n-1)/n, one
// line per size on rank 0: "size time_us algbw_GBps busbw_GBps". Built by
// scripts/build-mpi-bench.sh when Debian's libgloo-dev is installed.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace {

void sum_floats(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s RANK WORLD STORE_DIR MIN_BYTES MAX_BYTES FACTOR ITERS\n",
                 argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int world = std::atoi(argv[2]);
  const long min = std::atol(argv[4]), max = std::atol(argv[5]);
  const long factor = std::atol(argv[6]);
  const int iters = std::atoi(argv[7]);
  if (world < 1 || rank < 0 || rank >= world || min < 4 || max < min ||
      factor < 2 || iters < 1) {
    std::fprintf(stderr,
                 "need 0 <= RANK < WORLD, 4 <= MIN <= MAX, FACTOR >= 2, ITERS >= 1\n");
    return 2;
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(store, dev);

  std::vector<float> data(max / 4);
  auto barrier = [&] {
    gloo::BarrierOptions b(ctx);
    gloo::barrier(b);
  };
  auto allreduce = [&](size_t count) {
    gloo::AllreduceOptions o(ctx);
    o.setOutput(data.data(), count);
    o.setReduceFunction(sum_floats);
    gloo::allreduce(o);
  };
  auto average = [&](double mine) {
    double t = mine;
    gloo::AllreduceOptions o(ctx);
    o.setOutput(&t, 1);
    o.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
      auto* out = static_cast<double*>(c);
      const auto* x = static_cast<const double*>(a);
      const auto* y = static_cast<const double*>(b);
      for (size_t i = 0; i < n; i++) out[i] = x[i] + y[i];
    });
    gloo::allreduce(o);
    return t / world;
  };
  if (rank == 0)
    std::printf("# gloo::allreduce float sum, %d ranks\n"
                "# size_B time_us algbw_GBps busbw_GBps\n",
                world);
  for (long size = min; size <= max; size *= factor) {
    const size_t count = size / 4;
    for (size_t i = 0; i < count; i++) data[i] = static_cast<float>(i % 17);
    allreduce(count);
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) allreduce(count);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    const double t = average(dt.count() / iters);
    const double alg = static_cast<double>(size) / 1e9 / t;
    if (rank == 0)
      std::printf("%12ld %10.2f %8.3f %8.3f\n", size, t * 1e6, alg,
                  alg * 2.0 * (world - 1) / world);
    std::fflush(stdout);
  }
  return 0;
}
