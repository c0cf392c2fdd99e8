// Small RAII and error helpers around the HDF5 C API, private to store.
#pragma once
#include <hdf5.h>

#include <optional>
#include <string>
#include <vector>

namespace dc::h5 {

// Owns one HDF5 identifier and closes it with the right function.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Gives up ownership (the caller closes, and checks the close).
  hid_t release() {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's own error printing; we report errors ourselves.
void silence_errors();
// The innermost message on HDF5's error stack, for our own error text.
std::string last_error();

// Attribute readers. Return nullopt when the attribute is absent; throw
// InputError (naming `where` and the attribute) when it has the wrong type.
std::optional<std::string> read_string_attr(hid_t obj, const char* name, const std::string& where);
std::optional<long long> read_int_attr(hid_t obj, const char* name, const std::string& where);
std::optional<double> read_float_attr(hid_t obj, const char* name, const std::string& where);

// Attribute writers (collective when the file is opened with MPI-IO).
void write_string_attr(hid_t obj, const char* name, const std::string& value);
void write_int_attr(hid_t obj, const char* name, long long value);
void write_float_attr(hid_t obj, const char* name, double value);

}  // namespace dc::h5
