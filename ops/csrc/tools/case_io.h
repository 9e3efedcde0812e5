// The case folders of the kernel-level drivers: "name value" lines in case.txt and raw
// little-endian arrays <input>.bin; outputs are written as <variant>.<output>.bin.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/types.h"

namespace quest::tools {

using quest::DType;

struct Case {
  std::string dir;
  std::map<std::string, std::string> fields;

  const std::string& text(const std::string& key) const {
    auto found = fields.find(key);
    if (found == fields.end()) throw std::runtime_error("case.txt lacks " + key);
    return found->second;
  }
  int64_t integer(const std::string& key) const { return std::stoll(text(key)); }
  float real(const std::string& key) const { return std::stof(text(key)); }
  bool has(const std::string& key) const { return fields.count(key) != 0; }
  DType dtype(const std::string& key) const {
    const std::string& name = text(key);
    if (name == "float32") return DType::F32;
    if (name == "float16") return DType::F16;
    if (name == "int8") return DType::I8;
    throw std::runtime_error(key + " is " + name + ": expected float32, float16 or int8");
  }

  std::vector<char> read(const std::string& name, size_t bytes) const {
    std::ifstream in(dir + "/" + name + ".bin", std::ios::binary);
    std::vector<char> data(bytes);
    if (!in.read(data.data(), static_cast<std::streamsize>(bytes)))
      throw std::runtime_error("cannot read " + std::to_string(bytes) + " bytes of " + name + ".bin");
    return data;
  }
  void write(const std::string& variant, const std::string& name, const void* data, size_t bytes) const {
    std::ofstream out(dir + "/" + variant + "." + name + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  }
};

inline Case load_case(const std::string& dir) {
  Case c{dir, {}};
  std::ifstream in(dir + "/case.txt");
  if (!in) throw std::runtime_error("cannot open " + dir + "/case.txt");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, value;
    if (words >> key >> value) c.fields[key] = value;
  }
  return c;
}

inline size_t bytes_of(DType dtype, int64_t count) {
  return static_cast<size_t>(count) * (dtype == DType::F32 ? 4 : dtype == DType::F16 ? 2 : 1);
}

}  // namespace quest::tools
