#include "search_scratch.h"

namespace kbcore {

// Out of line on purpose (see search_scratch.h).
SearchScratch& search_scratch() {
  thread_local SearchScratch scratch;
  return scratch;
}

}  // namespace kbcore
