#include "harness/report/png.h"

#include <png.h>

#include <algorithm>
#include <cmath>

#include "harness/core/error.h"

namespace dc::html {
namespace {

void append(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}

}  // namespace

std::string png_bytes(const std::vector<std::uint8_t>& rgb, std::size_t width, std::size_t height) {
  if (rgb.size() != width * height * 3) fail("png: {} bytes for a {} x {} RGB image", rgb.size(), width, height);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (!png) fail("png: png_create_write_struct failed");
  png_infop info = png_create_info_struct(png);
  std::string out;
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    fail("png: libpng could not encode a {} x {} image", width, height);
  }
  png_set_write_fn(png, &out, append, nullptr);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (std::size_t y = 0; y < height; ++y)
    png_write_row(png, const_cast<png_bytep>(rgb.data() + y * width * 3));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::uint32_t b0 = static_cast<unsigned char>(bytes[i]);
    const std::uint32_t b1 = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    const std::uint32_t b2 = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
    const std::uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

std::string png_data_uri(const std::vector<double>& image, std::size_t width, std::size_t height, std::size_t channels,
                         double low, double range, std::size_t scale) {
  if (channels != 1 && channels != 3) fail("png: {} channels (1 or 3 are drawn)", channels);
  const std::size_t w = width * scale, h = height * scale;
  std::vector<std::uint8_t> rgb(w * h * 3);
  for (std::size_t y = 0; y < h; ++y)
    for (std::size_t x = 0; x < w; ++x)
      for (std::size_t c = 0; c < 3; ++c) {
        const double v = image[((y / scale) * width + x / scale) * channels + (channels == 3 ? c : 0)];
        const double unit = std::isfinite(v) ? std::clamp((v - low) / range, 0.0, 1.0) : 1.0;
        rgb[(y * w + x) * 3 + c] = static_cast<std::uint8_t>(std::lround(unit * 255.0));
      }
  return "data:image/png;base64," + base64(png_bytes(rgb, w, h));
}

}  // namespace dc::html
