#pragma once
// fulgur::data::NpyArray: a NumPy .npy file, memory-mapped, as a dataset of its first dimension.
//
//   fulgur::data::NpyArray images("train_images.npy");   // np.save'd uint8 array (N, 3, 64, 64)
//   at::Tensor first = images.get(0);                    // (3, 64, 64) uint8, a view: no copy
//
// The file is read by format versions 1.0, 2.0 and 3.0; the array must be C-ordered and
// little-endian, of dtype bool, (u)int8/16/32/64, float16/32/64 or complex64/128. The constructor
// checks the header and that the file holds exactly the bytes the header describes; get() is then
// pointer arithmetic, safe to call from several threads at once (DataLoader workers).
//
// The tensors returned are views into the mapping, which they keep alive: a tensor may outlive the
// NpyArray. The mapping is read-only, but at::from_blob makes a tensor that LibTorch thinks writable:
// writing into one (an in-place op, copy_ into it) kills the process with SIGSEGV, after a line naming
// the file and the fix (src/data/mapped_file.cpp). Clone a sample before changing it in place; collating
// (at::stack) copies anyway.
// The data may start at an offset that is not a multiple of the element size (a file written by
// hand; NumPy pads the header to 64 bytes): LibTorch's CPU kernels read such tensors correctly,
// and a copy to the GPU copies bytes, but a custom kernel that assumes alignment must copy first.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fulgur::data {

namespace detail {
class MappedFile;
}

class NpyArray {
 public:
  /// Maps and checks `path`; a DataError naming the file, what is wrong and what to do otherwise.
  explicit NpyArray(std::string path);

  /// The number of samples: the first dimension (a 0-d array is refused by the constructor).
  std::int64_t size() const { return shape_.front(); }
  /// Sample `index` (0 <= index < size()): the array's sub-array [index], a read-only view.
  at::Tensor get(std::int64_t index) const;
  /// The whole array, a read-only view.
  at::Tensor tensor() const;

  const std::vector<std::int64_t>& shape() const { return shape_; }
  at::ScalarType dtype() const { return dtype_; }
  const std::string& path() const { return path_; }
  /// Where the data starts in the file (the header's length).
  std::int64_t data_offset() const { return data_offset_; }

 private:
  at::Tensor view(const void* data, std::vector<std::int64_t> shape) const;

  std::string path_;
  std::shared_ptr<const detail::MappedFile> file_;
  std::vector<std::int64_t> shape_;
  at::ScalarType dtype_ = at::ScalarType::Undefined;
  std::int64_t data_offset_ = 0;
  std::int64_t sample_bytes_ = 0;
};

}  // namespace fulgur::data
