// Pictures for the self-contained HTML pages: an RGB image encoded as PNG
// (through libpng) and written as a data: URI.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dc::html {

// `rgb`: height x width x 3 bytes, row-major. Throws Error if libpng fails.
std::string png_bytes(const std::vector<std::uint8_t>& rgb, std::size_t width, std::size_t height);
std::string base64(const std::string& bytes);
// "data:image/png;base64,..." of values in [low, low + range] per channel ([H, W, C],
// C = 1 or 3), each pixel scaled to 0..255 and repeated `scale` times along
// both axes (small images stay visible).
std::string png_data_uri(const std::vector<double>& image, std::size_t width, std::size_t height, std::size_t channels,
                         double low, double range, std::size_t scale);

}  // namespace dc::html
