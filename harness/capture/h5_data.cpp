#include "harness/capture/h5_data.h"

#include "harness/core/error.h"

namespace dc {

std::shared_ptr<H5Data> H5Data::run_file(std::string path) {
  std::shared_ptr<H5Data> d(new H5Data());
  d->run_path_ = std::move(path);
  return d;
}

std::shared_ptr<H5Data> H5Data::rank_files(std::vector<std::string> files) {
  std::shared_ptr<H5Data> d(new H5Data());
  d->rank_files_ = std::move(files);
  return d;
}

std::size_t H5Data::add_tap(const std::string& dataset) {
  taps_.push_back(dataset);
  references_.emplace_back();
  return taps_.size() - 1;
}

void H5Data::set_reference(std::size_t data_id, const std::string& file,
                           const std::string& dataset) {
  references_.at(data_id) = std::make_pair(file, dataset);
}

hid_t H5Data::dataset(const std::string& file, const std::string& path) const {
  std::string key = file + '\n' + path;
  if (auto it = index_.find(key); it != index_.end()) {
    open_.splice(open_.begin(), open_, it->second);
    return it->second->second.get();
  }
  // The dataset keeps its file open after the file handle closes (HDF5's
  // default weak close), so only datasets are cached.
  h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) input_error("{}: cannot open HDF5 file: {}", file, h5::last_error());
  h5::Handle ds(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT));
  if (!ds.valid()) input_error("{}:{}: cannot open dataset: {}", file, path, h5::last_error());
  if (open_.size() >= kOpenDatasets) {
    index_.erase(open_.back().first);
    open_.pop_back();
  }
  open_.emplace_front(key, std::move(ds));
  index_[key] = open_.begin();
  return open_.front().second.get();
}

void H5Data::read(const std::string& file, const std::string& path, long long leading,
                  const Slab& slab, double* out, const std::string& what) const {
  std::lock_guard<std::mutex> lock(mu_);
  hid_t ds = dataset(file, path);
  h5::Handle space(H5Dget_space(ds));
  std::vector<hsize_t> start, count;
  if (leading >= 0) {
    start.push_back(static_cast<hsize_t>(leading));
    count.push_back(1);
  }
  start.insert(start.end(), slab.start.begin(), slab.start.end());
  count.insert(count.end(), slab.count.begin(), slab.count.end());
  hsize_t n = numel(slab.count);
  h5::Handle mem(H5Screate_simple(1, &n, nullptr));
  // A scalar dataspace (0-d tap in a rank file) takes no hyperslab.
  bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  if (!scalar && H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                     count.data(), nullptr) < 0)
    input_error("{}: cannot select elements: {}", what, h5::last_error());
  if (H5Dread(ds, H5T_NATIVE_DOUBLE, mem.get(), scalar ? H5S_ALL : space.get(), H5P_DEFAULT,
              out) < 0)
    input_error("{}: cannot read data: {}", what, h5::last_error());
}

void H5Data::read_piece(const TapData& t, int rank, const Slab& slab, double* out) const {
  const std::string& path = taps_.at(t.data_id);
  if (!run_path_.empty()) {
    read(run_path_, path, rank, slab, out, run_path_ + ": tap '" + t.name + "'");
  } else {
    const std::string& file = rank_files_.at(static_cast<std::size_t>(rank));
    read(file, path, -1, slab, out, file + ": tap '" + t.name + "'");
  }
}

void H5Data::read_reference(const TapData& t, const Slab& slab, double* out) const {
  const auto& ref = references_.at(t.data_id);
  if (!ref) fail("tap '{}' has no reference", t.name);
  read(ref->first, ref->second, -1, slab, out, ref->first + ":" + ref->second);
}

}  // namespace dc
