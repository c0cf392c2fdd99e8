/* A tap's dataset and its scalar attributes in one call, for
 * diffcheck/dump/h5_direct.py: made one C call at a time from Python, a
 * sketch tap's dataset and its ten attributes took some 30 ctypes calls and
 * as much Python around them, half the time of the write (a sketch capture
 * writes one such dataset per tap and device each call).
 *
 * The HDF5 functions are passed in by address: they are those of the very
 * library h5py loaded (a wheel's bundled HDF5, or Debian's), whose handles
 * the caller holds, so this file links no HDF5 and assumes only the ABI
 * h5_direct.py already relies on (hid_t 64-bit, herr_t int, hsize_t 64-bit;
 * HDF5 1.10 and later). The caller holds h5py's lock. */
#include <stdint.h>
#include <string.h>

typedef int64_t hid;
typedef int herr;

typedef struct {
  hid (*screate_simple)(int rank, const uint64_t *dims, const uint64_t *maxdims);
  herr (*sclose)(hid space);
  hid (*dcreate2)(hid loc, const char *name, hid type, hid space, hid lcpl, hid dcpl, hid dapl);
  herr (*dwrite)(hid dataset, hid memory_type, hid memory_space, hid file_space, hid dxpl, const void *data);
  herr (*dclose)(hid dataset);
  hid (*acreate2)(hid owner, const char *name, hid type, hid space, hid acpl, hid aapl);
  herr (*awrite)(hid attribute, hid memory_type, const void *data);
  herr (*aclose)(hid attribute);
} diffcheck_h5_functions;

enum { ATTRIBUTE_INT = 0, ATTRIBUTE_FLOAT = 1, ATTRIBUTE_STRING = 2 };
#define H5_DEFAULT 0 /* H5P_DEFAULT and H5S_ALL are 0 in every HDF5 since 1.8 */

/* Makes the dataset `name` under `loc` of `ndim` dimensions `dims` (0: a
 * scalar, `scalar` the scalar dataspace) holding `data` (C-ordered, in
 * `memory_type`; not written when has_data is 0), then its `count` scalar
 * attributes: names[i] NUL-terminated strings packed one after another in
 * `names`, kinds[i] ATTRIBUTE_*, the value ints[i], floats[i] or the next of
 * the strings packed in `strings`; types[2 * kind] the file type and
 * types[2 * kind + 1] the memory type of each kind (a string's: a C string
 * pointer type). Returns 0 when all is written; -1 when the dataset could
 * not be made (nothing is left: the caller repeats it through h5py for
 * HDF5's message); i + 1 when attribute i could not be (the dataset is left
 * with the attributes before it). */
int32_t diffcheck_h5_write_dataset(const diffcheck_h5_functions *f, hid loc, const char *name, hid file_type,
                                   hid memory_type, hid scalar, hid lcpl, hid dcpl, int32_t ndim,
                                   const uint64_t *dims, const void *data, int32_t has_data, int32_t count,
                                   const char *names, const int32_t *kinds, const int64_t *ints,
                                   const double *floats, const char *strings, const hid *types) {
  hid space = scalar;
  if (ndim > 0 && (space = f->screate_simple(ndim, dims, NULL)) < 0) return -1;
  hid dataset = f->dcreate2(loc, name, file_type, space, lcpl, dcpl, H5_DEFAULT);
  if (ndim > 0) f->sclose(space);
  if (dataset < 0) return -1;
  if (has_data && f->dwrite(dataset, memory_type, H5_DEFAULT, H5_DEFAULT, H5_DEFAULT, data) < 0) {
    f->dclose(dataset);
    return -1; /* (the dataset stays, as h5_direct.create_dataset's would: h5py's repeat names it taken) */
  }
  int32_t failed = 0;
  for (int32_t i = 0; i < count && !failed; ++i) {
    int32_t kind = kinds[i];
    hid attribute = f->acreate2(dataset, names, types[2 * kind], scalar, H5_DEFAULT, H5_DEFAULT);
    if (attribute < 0) {
      failed = i + 1;
      break;
    }
    const void *value = kind == ATTRIBUTE_INT ? (const void *)&ints[i] : (const void *)&floats[i];
    const char *text = strings;
    if (kind == ATTRIBUTE_STRING) {
      value = &text; /* a variable-length string is written from a pointer to its C string */
      strings += strlen(strings) + 1;
    }
    if (f->awrite(attribute, types[2 * kind + 1], value) < 0) failed = i + 1;
    f->aclose(attribute);
    names += strlen(names) + 1;
  }
  f->dclose(dataset);
  return failed;
}
