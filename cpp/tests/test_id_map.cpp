// IdMap (id -> slot) against std::map.

#include <map>
#include <random>
#include <vector>

#include "id_map.h"
#include "test_util.h"

using namespace kbcore_test;

// IdMap against std::map under random inserts, erases (backward shift) and lookups, with ids
// that collide in the low bits and slots reused LIFO as VectorStore reuses them.
KBCORE_TEST(id_map_agrees_with_oracle) {
  using namespace kbcore;
  std::mt19937_64 rng(11);
  for (const std::int64_t spread : {std::int64_t{64}, std::int64_t{1} << 40}) {
    IdMap map;
    std::map<std::int64_t, Slot> oracle;
    std::vector<std::int64_t> ids;  // id per slot
    std::vector<Slot> free;
    for (int step = 0; step < 200000; ++step) {
      const std::int64_t id = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(spread)) * 1024 - spread;
      const auto it = oracle.find(id);
      const auto got = map.find(id, ids.data());
      CHECK(got.has_value() == (it != oracle.end()));
      if (got) CHECK(*got == it->second);
      if (it == oracle.end() && rng() % 3 != 0) {
        Slot s;
        if (!free.empty()) {
          s = free.back();
          free.pop_back();
        } else {
          s = static_cast<Slot>(ids.size());
          ids.push_back(0);
        }
        ids[s] = id;
        map.insert(id, s, ids.data());
        oracle.emplace(id, s);
      } else if (it != oracle.end()) {
        CHECK(map.erase(id, ids.data()));
        free.push_back(it->second);
        oracle.erase(it);
        CHECK(!map.find(id, ids.data()));
      }
      CHECK(map.size() == oracle.size());
    }
    for (const auto& [id, s] : oracle) {
      const auto got = map.find(id, ids.data());
      CHECK(got && *got == s);
    }
    CHECK(!map.erase(spread * 4096 + 7, ids.data()));
    CHECK(map.bucket_count() >= 2 * map.size());
  }
}
