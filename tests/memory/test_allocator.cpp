#include <remat/memory/allocator.hpp>
#include <remat/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <iterator>
#include <string>

using namespace remat;
using memory::tag;
using alloc_t = memory::caching_allocator<host>;

TEST_CASE("allocator: requests are rounded up to 256 bytes and counted exactly", "[memory]") {
  STATIC_REQUIRE(alloc_t::rounded(1) == 256);
  STATIC_REQUIRE(alloc_t::rounded(256) == 256);
  STATIC_REQUIRE(alloc_t::rounded(257) == 512);
  alloc_t a;
  void* p = a.allocate(1000, tag::activations);
  REQUIRE(p != nullptr);
  auto s = a.stats();
  CHECK(s[tag::activations].in_use == 1024);
  CHECK(s[tag::activations].peak == 1024);
  CHECK(s[tag::activations].reserved == 1024);
  CHECK(s.total.in_use == 1024);
  CHECK(s[tag::parameters].in_use == 0);
  CHECK(s.system_allocations == 1);
  a.deallocate(p);
  s = a.stats();
  CHECK(s[tag::activations].in_use == 0);
  CHECK(s[tag::activations].peak == 1024);
  CHECK(s[tag::activations].reserved == 1024);  // cached, not returned
  CHECK(s.total.in_use == 0);
}

TEST_CASE("allocator: a freed block is reused for the same tag and size", "[memory]") {
  alloc_t a;
  void* p = a.allocate(4000, tag::workspace);
  a.deallocate(p);
  void* q = a.allocate(3900, tag::workspace);  // rounds to the same 4096
  CHECK(q == p);
  auto s = a.stats();
  CHECK(s.system_allocations == 1);
  CHECK(s.cache_hits == 1);
  void* r = a.allocate(4000, tag::gradients);  // another tag has its own pool
  CHECK(r != p);
  s = a.stats();
  CHECK(s.system_allocations == 2);
  CHECK(s[tag::gradients].reserved == 4096);
  CHECK(s[tag::workspace].reserved == 4096);
  CHECK(s.total.reserved == 8192);
  a.deallocate(q);
  a.deallocate(r);
}

TEST_CASE("allocator: a growing_size site asks the system once per new largest need", "[memory]") {
  memory::growing_size exact;
  CHECK(exact(1000) == 1000);
  CHECK(exact(10) == 1000);
  CHECK(exact(1001) == 1001);
  CHECK(exact(0) == 1001);
  memory::growing_size pad(4096, true);  // powers of two from 4 KiB
  CHECK(pad(1) == 4096);
  CHECK(pad(4097) == 8192);
  CHECK(pad(5000) == 8192);
  CHECK(pad(8193) == 16384);
  CHECK(pad(100) == 16384);
  // Needs that vary with the call (larger at a small batch than at the largest, as oneDNN's AMX
  // scratchpads are): after the largest power of two, one cached block serves every call.
  alloc_t a;
  memory::growing_size site(4096, true);
  std::size_t const needs[] = {9000, 3000, 12000, 16384, 700, 15000, 9000, 1};
  std::size_t const calls[] = {1, 1, 1, 1, 1, 1, 1, 1};  // 9000 -> 16384 serves them all
  for (std::size_t i = 0; i < std::size(needs); ++i) {
    void* p = a.allocate(site(needs[i]), tag::workspace);
    a.deallocate(p);
    CHECK(a.stats().system_allocations == calls[i]);
  }
  CHECK(a.stats()[tag::workspace].reserved == 16384);
  std::size_t const more[] = {16385, 20000, 30000, 5};
  std::size_t const then[] = {2, 2, 2, 2};  // 32768 once
  for (std::size_t i = 0; i < std::size(more); ++i) {
    void* p = a.allocate(site(more[i]), tag::workspace);
    a.deallocate(p);
    CHECK(a.stats().system_allocations == then[i]);
  }
}

TEST_CASE("allocator: the total peak is the peak of the sum, not the sum of peaks", "[memory]") {
  alloc_t a;
  void* p = a.allocate(512, tag::parameters);
  a.deallocate(p);
  void* q = a.allocate(768, tag::activations);
  auto s = a.stats();
  CHECK(s[tag::parameters].peak == 512);
  CHECK(s[tag::activations].peak == 768);
  CHECK(s.total.peak == 768);
  void* r = a.allocate(256, tag::parameters);
  s = a.stats();
  CHECK(s.total.peak == 1024);
  CHECK(s.total.in_use == 1024);
  a.deallocate(q);
  a.deallocate(r);
}

TEST_CASE("allocator: reset_peak restarts the measurement from what is in use", "[memory]") {
  alloc_t a;
  void* p = a.allocate(256 * 10, tag::activations);
  void* q = a.allocate(256 * 3, tag::optimizer_state);
  a.deallocate(p);
  CHECK(a.stats().total.peak == 256 * 13);
  a.reset_peak();
  auto s = a.stats();
  CHECK(s.total.peak == 256 * 3);
  CHECK(s[tag::activations].peak == 0);
  CHECK(s[tag::optimizer_state].peak == 256 * 3);
  void* r = a.allocate(256, tag::activations);  // from the cache? no: another size
  CHECK(a.stats().total.peak == 256 * 4);
  a.deallocate(q);
  a.deallocate(r);
}

TEST_CASE("allocator: release_cached gives free blocks back to the system", "[memory]") {
  alloc_t a;
  void* p = a.allocate(1024, tag::activations);
  void* q = a.allocate(2048, tag::gradients);
  a.deallocate(p);
  CHECK(a.stats().total.reserved == 3072);
  a.release_cached();
  auto s = a.stats();
  CHECK(s.total.reserved == 2048);
  CHECK(s[tag::activations].reserved == 0);
  CHECK(s[tag::gradients].reserved == 2048);
  a.deallocate(q);
}

TEST_CASE("allocator: past the limit throws out_of_memory with the summary and changes nothing", "[memory]") {
  alloc_t a(4096);
  void* p = a.allocate(2048, tag::parameters);
  auto const before = a.stats();
  try {
    (void)a.allocate(4096, tag::activations);
    FAIL("expected out_of_memory");
  } catch (out_of_memory const& e) {
    std::string const msg = e.what();
    CHECK(msg.find("4.00 KiB") != std::string::npos);     // what was asked for
    CHECK(msg.find("activations") != std::string::npos);  // of what
    CHECK(msg.find("2.00 KiB already reserved") != std::string::npos);  // what was found
    CHECK(msg.find("in use") != std::string::npos);  // and the summary table
    CHECK(msg.find("parameters") != std::string::npos);
  }
  auto const after = a.stats();
  CHECK(after.total.in_use == before.total.in_use);
  CHECK(after.total.reserved == before.total.reserved);
  CHECK(after.total.peak == before.total.peak);
  // out_of_memory is a remat::error
  CHECK_THROWS_AS(a.allocate(1 << 20, tag::workspace), error);
  a.deallocate(p);
}

TEST_CASE("allocator: under the limit, cached blocks of any tag are released to make room", "[memory]") {
  alloc_t a(3072);
  void* p = a.allocate(2048, tag::parameters);
  a.deallocate(p);  // cached: 2048 reserved
  void* q = a.allocate(2048, tag::activations);
  auto s = a.stats();
  CHECK(s.total.reserved == 2048);
  CHECK(s[tag::parameters].reserved == 0);
  CHECK(s[tag::activations].in_use == 2048);
  a.deallocate(q);
}

TEST_CASE("allocator: zero bytes is an argument_error", "[memory]") {
  alloc_t a;
  CHECK_THROWS_AS(a.allocate(0, tag::activations), argument_error);
  CHECK_THROWS_WITH(a.allocate(0, tag::activations), Catch::Contains("found 0"));
}

TEST_CASE("allocator: the summary has a row per tag of remat's and a total", "[memory]") {
  alloc_t a;
  void* p = a.allocate(3 << 20, tag::optimizer_state);
  std::string const s = a.summary();
  for (auto t : memory::all_tags) CHECK((s.find(memory::name(t)) != std::string::npos) == !memory::is_user(t));
  CHECK(s.find("total") != std::string::npos);
  CHECK(s.find("3.00 MiB") != std::string::npos);
  CHECK(memory::format_bytes(1536) == "1.50 KiB");
  CHECK(memory::format_bytes(100) == "100 B");
  a.deallocate(p);
}

TEST_CASE("allocator: the program's own tags are counted apart, named, and in the summary once used", "[memory]") {
  alloc_t a(4096);
  a.name_tag(tag::user1, "solver");
  CHECK(a.tag_name(tag::user1) == "solver");
  CHECK(a.tag_name(tag::user2) == "user 2");
  CHECK(a.tag_name(tag::gradients) == "gradients");
  CHECK_THROWS_AS(a.name_tag(tag::activations, "mine"), argument_error);
  CHECK(a.tag_name(tag::activations) == "activations");  // (unchanged)
  {
    tensor<double> u(4, 100, tag::user1, a);  // 3200 bytes -> 3328
    void* q = a.allocate(100, tag::user3);    // 256
    auto const s = a.stats();
    CHECK(s[tag::user1].in_use == 3328);
    CHECK(s[tag::user3].reserved == 256);
    CHECK(s[tag::user2].peak == 0);
    CHECK(s.total.in_use == 3584);
    std::string const table = a.summary();
    CHECK(table.find("solver") != std::string::npos);
    CHECK(table.find("user 3") != std::string::npos);
    CHECK(table.find("user 2") == std::string::npos);  // never used: no row
    // Past the limit: the message names the tag as the program named it.
    CHECK_THROWS_WITH(a.allocate(1024, tag::user1), Catch::Contains("of solver, found 3.50 KiB"));
    a.deallocate(q);
  }
  CHECK(a.stats().total.in_use == 0);
}

TEST_CASE("allocator: tensors allocate through it with their tag", "[memory][tensor]") {
  alloc_t a;
  {
    tensor<float, host, 100> x(3, tag::activations, a);   // 1200 bytes -> 1280
    tensor<double> w(4, 8, tag::parameters, a);           // 256 bytes
    auto s = a.stats();
    CHECK(s[tag::activations].in_use == 1280);
    CHECK(s[tag::parameters].in_use == 256);
    CHECK(s.total.in_use == 1536);
  }
  auto s = a.stats();
  CHECK(s.total.in_use == 0);
  CHECK(s.total.peak == 1536);
}
