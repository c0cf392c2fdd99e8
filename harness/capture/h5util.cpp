#include "harness/capture/h5util.h"

#include "harness/core/error.h"

namespace dc::h5 {

void Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: H5Idec_ref(id_); break;
  }
  id_ = H5I_INVALID_HID;
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string last_error() {
  std::string msg;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto* m = static_cast<std::string*>(data);
        if (n == 0 && e->desc) *m = e->desc;
        return 0;
      },
      &msg);
  H5Eclear2(H5E_DEFAULT);
  if (msg.empty()) return "unknown HDF5 error";
  // A failed read or write of HDF5's file drivers says, over two lines, when,
  // which descriptor, buffer and sizes: only the operation and the system's
  // words ("file write failed: No space left on device") are for users.
  const std::string key = "error message = '";
  const auto at = msg.find(key), colon = msg.find(": time = ");
  if (at != std::string::npos && colon != std::string::npos) {
    const auto end = msg.find('\'', at + key.size());
    if (end != std::string::npos) return msg.substr(0, colon) + ": " + msg.substr(at + key.size(), end - at - key.size());
  }
  return msg;
}

namespace {

Handle open_attr(hid_t obj, const char* name) {
  htri_t exists = H5Aexists(obj, name);
  if (exists <= 0) return Handle();
  return Handle(H5Aopen(obj, name, H5P_DEFAULT));
}

void require_scalar(hid_t attr, const char* name, const std::string& where) {
  Handle space(H5Aget_space(attr));
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    input_error("{}: attribute '{}' must be a single value", where, name);
}

}  // namespace

std::optional<std::string> read_string_attr(hid_t obj, const char* name, const std::string& where) {
  Handle attr = open_attr(obj, name);
  if (!attr.valid()) return std::nullopt;
  Handle type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING)
    input_error("{}: attribute '{}' must be a string", where, name);
  require_scalar(attr.get(), name, where);
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    if (H5Aread(attr.get(), mem.get(), &s) < 0)
      input_error("{}: cannot read attribute '{}': {}", where, name, last_error());
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  std::size_t n = H5Tget_size(type.get());
  std::string buf(n, '\0');
  Handle mem(H5Tcopy(H5T_C_S1));
  H5Tset_size(mem.get(), n);
  H5Tset_strpad(mem.get(), H5T_STR_NULLPAD);
  if (H5Aread(attr.get(), mem.get(), buf.data()) < 0)
    input_error("{}: cannot read attribute '{}': {}", where, name, last_error());
  auto end = buf.find('\0');
  if (end != std::string::npos) buf.resize(end);
  return buf;
}

std::optional<long long> read_int_attr(hid_t obj, const char* name, const std::string& where) {
  Handle attr = open_attr(obj, name);
  if (!attr.valid()) return std::nullopt;
  Handle type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    input_error("{}: attribute '{}' must be an integer", where, name);
  require_scalar(attr.get(), name, where);
  long long v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_LLONG, &v) < 0)
    input_error("{}: cannot read attribute '{}': {}", where, name, last_error());
  return v;
}

std::optional<double> read_float_attr(hid_t obj, const char* name, const std::string& where) {
  Handle attr = open_attr(obj, name);
  if (!attr.valid()) return std::nullopt;
  Handle type(H5Aget_type(attr.get()));
  auto cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    input_error("{}: attribute '{}' must be a number", where, name);
  require_scalar(attr.get(), name, where);
  double v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v) < 0)
    input_error("{}: cannot read attribute '{}': {}", where, name, last_error());
  return v;
}

namespace {
void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* data) {
  Handle space(H5Screate(H5S_SCALAR));
  Handle attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, data) < 0)
    fail("HDF5: cannot write attribute '{}': {}", name, last_error());
}
}  // namespace

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  // Variable-length UTF-8: what h5py writes for a Python str, and reads back as str.
  Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* p = value.c_str();
  write_attr(obj, name, type.get(), type.get(), &p);
}

void write_int_attr(hid_t obj, const char* name, long long value) {
  write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &value);
}

void write_float_attr(hid_t obj, const char* name, double value) {
  write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

}  // namespace dc::h5
