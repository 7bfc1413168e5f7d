// The checkpoint formats of the shipped strategies (checkpoint/format.hpp): what any run reads
// beside a checkpoint's file. SingleDeviceStrategy and DDPStrategy write one file and need none.
#include "fulgur/checkpoint/format.hpp"
#include "src/strategies/sharded/checkpoint_format.hpp"

namespace fulgur::detail {

std::vector<const checkpoint::Format*> shipped_checkpoint_formats() { return {&distributed::sharded_checkpoint_format()}; }

}  // namespace fulgur::detail
