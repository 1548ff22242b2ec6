// GGUF v2/v3 reader: memory-maps the file and exposes metadata and tensor descriptors without copying weights.
//
// The parser treats the file as untrusted input: every length and count is checked against the bytes that
// remain before it is used (so a corrupted count cannot trigger a huge allocation), sizes are computed with
// overflow checks, and every failure is a gguf::error that names what was being read and at which offset.
// Format reference: the GGUF specification in the ggml repository (docs/gguf.md).
#pragma once

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ggml_type : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, bf16 = 30
};

// Metadata value types as numbered by the GGUF specification.
enum class value_type : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12
};

struct type_traits {
  const char* name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
};

// nullptr for a type this reader does not know (the parser rejects such tensors).
inline const type_traits* traits(ggml_type t) noexcept {
  static constexpr type_traits f32{"f32", 1, 4}, f16{"f16", 1, 2}, bf16{"bf16", 1, 2};
  static constexpr type_traits q4_0{"q4_0", 32, 18}, q4_1{"q4_1", 32, 20}, q5_0{"q5_0", 32, 22},
      q5_1{"q5_1", 32, 24}, q8_0{"q8_0", 32, 34};
  static constexpr type_traits q2_k{"q2_k", 256, 84}, q3_k{"q3_k", 256, 110}, q4_k{"q4_k", 256, 144},
      q5_k{"q5_k", 256, 176}, q6_k{"q6_k", 256, 210}, q8_k{"q8_k", 256, 292};
  switch (t) {
    case ggml_type::f32: return &f32;
    case ggml_type::f16: return &f16;
    case ggml_type::bf16: return &bf16;
    case ggml_type::q4_0: return &q4_0;
    case ggml_type::q4_1: return &q4_1;
    case ggml_type::q5_0: return &q5_0;
    case ggml_type::q5_1: return &q5_1;
    case ggml_type::q8_0: return &q8_0;
    case ggml_type::q2_k: return &q2_k;
    case ggml_type::q3_k: return &q3_k;
    case ggml_type::q4_k: return &q4_k;
    case ggml_type::q5_k: return &q5_k;
    case ggml_type::q6_k: return &q6_k;
    case ggml_type::q8_k: return &q8_k;
  }
  return nullptr;
}

inline std::string type_name(ggml_type t) {
  const type_traits* tr = traits(t);
  return tr ? tr->name : "ggml_type(" + std::to_string(static_cast<uint32_t>(t)) + ")";
}
inline uint32_t block_size(ggml_type t) { return traits(t) ? traits(t)->block_size : 0; }
inline uint32_t type_size(ggml_type t) { return traits(t) ? traits(t)->type_size : 0; }

inline const char* value_type_name(value_type t) noexcept {
  switch (t) {
    case value_type::u8: return "u8";
    case value_type::i8: return "i8";
    case value_type::u16: return "u16";
    case value_type::i16: return "i16";
    case value_type::u32: return "u32";
    case value_type::i32: return "i32";
    case value_type::f32: return "f32";
    case value_type::boolean: return "bool";
    case value_type::string: return "string";
    case value_type::array: return "array";
    case value_type::u64: return "u64";
    case value_type::i64: return "i64";
    case value_type::f64: return "f64";
  }
  return "unknown";
}

struct tensor_info {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the fastest-varying (row length)
  ggml_type type;
  uint64_t offset;           // relative to the data section
  const std::byte* data;     // points into the mmap
  uint64_t nbytes;
};

// One metadata entry. Strings and array elements are views into the file's bytes (the file owns them).
struct value {
  value_type type = value_type::u8;
  uint64_t u = 0;  // unsigned scalars and bool
  int64_t i = 0;   // signed scalars
  double f = 0;    // f32 / f64
  std::string_view str;
  // arrays
  value_type elem_type = value_type::u8;
  uint64_t count = 0;
  const std::byte* elems = nullptr;       // fixed-size element arrays: raw little-endian elements
  std::vector<std::string_view> strings;  // string arrays
};

namespace detail {

inline size_t scalar_size(value_type t) noexcept {
  switch (t) {
    case value_type::u8: case value_type::i8: case value_type::boolean: return 1;
    case value_type::u16: case value_type::i16: return 2;
    case value_type::u32: case value_type::i32: case value_type::f32: return 4;
    case value_type::u64: case value_type::i64: case value_type::f64: return 8;
    default: return 0;
  }
}

// Owns the file's bytes: either an mmap or a heap copy (from_memory), 64-byte aligned either way.
class region {
 public:
  region() = default;
  static region map(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw error("gguf: cannot open '" + path + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      throw error("gguf: cannot stat '" + path + "': " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw error("gguf: '" + path + "' is not a regular file");
    }
    region r;
    r.size_ = static_cast<size_t>(st.st_size);
    if (r.size_ == 0) {
      ::close(fd);
      throw error("gguf: '" + path + "' is empty");
    }
    void* p = ::mmap(nullptr, r.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);  // the mapping stays valid without the descriptor
    if (p == MAP_FAILED) throw error("gguf: cannot mmap '" + path + "': " + std::strerror(e));
    r.base_ = static_cast<std::byte*>(p);
    r.mapped_ = true;
    return r;
  }
  static region copy(std::span<const std::byte> bytes) {
    region r;
    r.size_ = bytes.size();
    r.base_ = static_cast<std::byte*>(::operator new(bytes.empty() ? 1 : bytes.size(), std::align_val_t{64}));
    if (!bytes.empty()) std::memcpy(r.base_, bytes.data(), bytes.size());
    return r;
  }
  region(region&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)), mapped_(o.mapped_) {}
  region& operator=(region&& o) noexcept {
    if (this != &o) {
      release();
      base_ = std::exchange(o.base_, nullptr);
      size_ = std::exchange(o.size_, 0);
      mapped_ = o.mapped_;
    }
    return *this;
  }
  region(const region&) = delete;
  region& operator=(const region&) = delete;
  ~region() { release(); }

  const std::byte* data() const noexcept { return base_; }
  size_t size() const noexcept { return size_; }

 private:
  void release() noexcept {
    if (!base_) return;
    if (mapped_) ::munmap(base_, size_);
    else ::operator delete(base_, std::align_val_t{64});
    base_ = nullptr;
  }
  std::byte* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

// Bounds-checked little-endian cursor. `what` describes the item being read, for the error message; it is
// only turned into a string when something fails, so the hot loops over 50k tokens stay cheap.
class cursor {
 public:
  cursor(const std::byte* base, uint64_t size) : base_(base), size_(size) {}
  uint64_t pos() const noexcept { return pos_; }
  uint64_t remaining() const noexcept { return size_ - pos_; }
  const std::byte* here() const noexcept { return base_ + pos_; }

  template <class Describe>
  void need(uint64_t n, const Describe& what) const {
    if (n > remaining())
      throw error("gguf: truncated file: need " + std::to_string(n) + " bytes for " + what() + " at offset " +
                  std::to_string(pos_) + ", only " + std::to_string(remaining()) + " left");
  }
  template <class T, class Describe>
  T read(const Describe& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <class Describe>
  void skip(uint64_t n, const Describe& what) {
    need(n, what);
    pos_ += n;
  }
  template <class Describe>
  std::string_view read_string(const Describe& what) {
    uint64_t len = read<uint64_t>([&] { return "the length of " + what(); });
    need(len, [&] { return what() + " (string of " + std::to_string(len) + " bytes)"; });
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const std::byte* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

inline std::string quoted(std::string_view s) {
  // Keys come from the file: keep messages printable and short even for garbage.
  std::string out = "'";
  for (char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 80) out += "...";
  return out + "'";
}

}  // namespace detail

class file {
 public:
  static file open(const std::string& path) {
    file f;
    f.region_ = detail::region::map(path);
    try {
      f.parse();
    } catch (const error& e) {
      throw error(std::string(e.what()) + " [in '" + path + "']");
    }
    return f;
  }
  static file from_memory(std::span<const std::byte> bytes) {
    file f;
    f.region_ = detail::region::copy(bytes);
    f.parse();
    return f;
  }

  file(file&&) noexcept = default;
  file& operator=(file&&) noexcept = default;
  file(const file&) = delete;
  file& operator=(const file&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }    // absolute offset of the data section
  std::span<const std::byte> bytes() const { return {region_.data(), region_.size()}; }

  bool has(std::string_view key) const { return kv_.find(key) != kv_.end(); }
  const value* find(std::string_view key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  const value& get(std::string_view key) const {
    const value* v = find(key);
    if (!v) throw error("gguf: missing metadata key " + detail::quoted(key));
    return *v;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : kv_) out.push_back(k);
    return out;
  }

  // Any integer type whose value fits in u32.
  uint32_t get_u32(std::string_view key) const {
    const value& v = get(key);
    uint64_t u = 0;
    if (!integer_as_u64(v, u) || u > std::numeric_limits<uint32_t>::max())
      throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected an integer that fits in u32");
    return static_cast<uint32_t>(u);
  }
  float get_f32(std::string_view key) const {
    const value& v = get(key);
    if (v.type != value_type::f32 && v.type != value_type::f64)
      throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected f32");
    return static_cast<float>(v.f);
  }
  bool get_bool(std::string_view key) const {
    const value& v = get(key);
    if (v.type != value_type::boolean)
      throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected bool");
    return v.u != 0;
  }
  std::string get_string(std::string_view key) const {
    const value& v = get(key);
    if (v.type != value_type::string)
      throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected string");
    return std::string(v.str);
  }
  std::vector<std::string> get_string_array(std::string_view key) const {
    const value& v = get(key);
    if (v.type != value_type::array || v.elem_type != value_type::string)
      throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected an array of strings");
    return {v.strings.begin(), v.strings.end()};
  }
  // Array of any integer element type whose values fit in i32.
  std::vector<int32_t> get_i32_array(std::string_view key) const {
    const value& v = get(key);
    std::vector<int32_t> out;
    if (v.type == value_type::array && detail::scalar_size(v.elem_type) != 0 && v.elem_type != value_type::f32 &&
        v.elem_type != value_type::f64 && v.elem_type != value_type::boolean) {
      out.reserve(static_cast<size_t>(v.count));
      const size_t es = detail::scalar_size(v.elem_type);
      for (uint64_t k = 0; k < v.count; ++k) {
        int64_t x = 0;
        if (!element_as_i64(v.elem_type, v.elems + k * es, x) || x < std::numeric_limits<int32_t>::min() ||
            x > std::numeric_limits<int32_t>::max())
          throw error("gguf: key " + detail::quoted(key) + " element " + std::to_string(k) + " does not fit in i32");
        out.push_back(static_cast<int32_t>(x));
      }
      return out;
    }
    throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected an array of integers");
  }
  std::vector<float> get_f32_array(std::string_view key) const {
    const value& v = get(key);
    if (v.type != value_type::array || (v.elem_type != value_type::f32 && v.elem_type != value_type::f64))
      throw error("gguf: key " + detail::quoted(key) + " is " + describe(v) + ", expected an array of f32");
    std::vector<float> out(static_cast<size_t>(v.count));
    for (uint64_t k = 0; k < v.count; ++k) {
      if (v.elem_type == value_type::f32) {
        std::memcpy(&out[k], v.elems + k * 4, 4);
      } else {
        double d;
        std::memcpy(&d, v.elems + k * 8, 8);
        out[k] = static_cast<float>(d);
      }
    }
    return out;
  }

  const tensor_info& tensor(std::string_view name) const {
    const tensor_info* t = find_tensor(name);
    if (!t) throw error("gguf: missing tensor " + detail::quoted(name));
    return *t;
  }
  const tensor_info* find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  const std::vector<tensor_info>& tensors() const { return tensors_; }

 private:
  file() = default;

  static constexpr uint32_t max_dims = 4;         // GGML_MAX_DIMS
  static constexpr int max_array_depth = 8;       // nested arrays are legal but useless; bound the recursion

  static std::string describe(const value& v) {
    if (v.type == value_type::array)
      return std::string("an array of ") + value_type_name(v.elem_type) + " (" + std::to_string(v.count) + " elements)";
    return std::string("of type ") + value_type_name(v.type);
  }
  static bool integer_as_u64(const value& v, uint64_t& out) {
    switch (v.type) {
      case value_type::u8: case value_type::u16: case value_type::u32: case value_type::u64:
        out = v.u;
        return true;
      case value_type::i8: case value_type::i16: case value_type::i32: case value_type::i64:
        if (v.i < 0) return false;
        out = static_cast<uint64_t>(v.i);
        return true;
      default: return false;
    }
  }
  static bool element_as_i64(value_type t, const std::byte* p, int64_t& out) {
    switch (t) {
      case value_type::u8: { uint8_t x; std::memcpy(&x, p, 1); out = x; return true; }
      case value_type::i8: { int8_t x; std::memcpy(&x, p, 1); out = x; return true; }
      case value_type::u16: { uint16_t x; std::memcpy(&x, p, 2); out = x; return true; }
      case value_type::i16: { int16_t x; std::memcpy(&x, p, 2); out = x; return true; }
      case value_type::u32: { uint32_t x; std::memcpy(&x, p, 4); out = x; return true; }
      case value_type::i32: { int32_t x; std::memcpy(&x, p, 4); out = x; return true; }
      case value_type::i64: { std::memcpy(&out, p, 8); return true; }
      case value_type::u64: {
        uint64_t x;
        std::memcpy(&x, p, 8);
        if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
        out = static_cast<int64_t>(x);
        return true;
      }
      default: return false;
    }
  }

  static bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(value_type::f64); }

  // Reads one value of type `t` (already read) into `out`.
  void read_value(detail::cursor& c, value_type t, value& out, const std::string& key, int depth) {
    auto what = [&] { return "the value of key " + detail::quoted(key); };
    out.type = t;
    switch (t) {
      case value_type::u8: out.u = c.read<uint8_t>(what); break;
      case value_type::u16: out.u = c.read<uint16_t>(what); break;
      case value_type::u32: out.u = c.read<uint32_t>(what); break;
      case value_type::u64: out.u = c.read<uint64_t>(what); break;
      case value_type::i8: out.i = c.read<int8_t>(what); break;
      case value_type::i16: out.i = c.read<int16_t>(what); break;
      case value_type::i32: out.i = c.read<int32_t>(what); break;
      case value_type::i64: out.i = c.read<int64_t>(what); break;
      case value_type::f32: out.f = c.read<float>(what); break;
      case value_type::f64: out.f = c.read<double>(what); break;
      case value_type::boolean: {
        uint64_t pos = c.pos();
        out.u = c.read<uint8_t>(what);
        if (out.u > 1)
          throw error("gguf: key " + detail::quoted(key) + ": invalid bool byte " + std::to_string(out.u) +
                      " at offset " + std::to_string(pos));
        break;
      }
      case value_type::string: out.str = c.read_string(what); break;
      case value_type::array: read_array(c, out, key, depth); break;
    }
  }

  void read_array(detail::cursor& c, value& out, const std::string& key, int depth) {
    auto what = [&] { return "the array header of key " + detail::quoted(key); };
    if (depth >= max_array_depth)
      throw error("gguf: key " + detail::quoted(key) + ": arrays nested deeper than " + std::to_string(max_array_depth));
    uint64_t pos = c.pos();
    uint32_t et = c.read<uint32_t>(what);
    if (!valid_value_type(et))
      throw error("gguf: key " + detail::quoted(key) + ": invalid array element type " + std::to_string(et) +
                  " at offset " + std::to_string(pos));
    out.elem_type = static_cast<value_type>(et);
    pos = c.pos();
    out.count = c.read<uint64_t>(what);
    // Every element takes at least this many bytes, so a count beyond remaining/min is a corrupt file, and
    // checking it first keeps a garbage count from driving a huge reserve().
    const size_t es = detail::scalar_size(out.elem_type);
    const uint64_t min_elem = es ? es : (out.elem_type == value_type::string ? 8 : 12);
    if (out.count > c.remaining() / min_elem)
      throw error("gguf: key " + detail::quoted(key) + ": array count " + std::to_string(out.count) + " at offset " +
                  std::to_string(pos) + " exceeds the " + std::to_string(c.remaining()) + " bytes left");
    if (es) {
      out.elems = c.here();
      c.skip(out.count * es, what);
      if (out.elem_type == value_type::boolean)
        for (uint64_t k = 0; k < out.count; ++k)
          if (static_cast<uint8_t>(out.elems[k]) > 1)
            throw error("gguf: key " + detail::quoted(key) + ": invalid bool in array element " + std::to_string(k));
    } else if (out.elem_type == value_type::string) {
      out.strings.reserve(static_cast<size_t>(out.count));
      for (uint64_t k = 0; k < out.count; ++k)
        out.strings.push_back(c.read_string(
            [&] { return "element " + std::to_string(k) + " of key " + detail::quoted(key); }));
    } else {  // nested arrays: validated and skipped (no known model uses them; get_* reports the type)
      for (uint64_t k = 0; k < out.count; ++k) {
        value inner;
        read_array(c, inner, key, depth + 1);
      }
    }
  }

  void parse() {
    const std::byte* base = region_.data();
    const uint64_t size = region_.size();
    detail::cursor c(base, size);

    uint32_t magic = c.read<uint32_t>([] { return std::string("the magic"); });
    if (magic != 0x46554747u)  // "GGUF" read as little-endian u32
      throw error("gguf: not a GGUF file (bad magic at offset 0)");
    version_ = c.read<uint32_t>([] { return std::string("the version"); });
    if (version_ == 1) throw error("gguf: GGUF version 1 is not supported (only 2 and 3)");
    if (version_ != 2 && version_ != 3) {
      std::string hint = (version_ & 0xffffu) == 0 ? " (a big-endian file?)" : "";
      throw error("gguf: unsupported GGUF version " + std::to_string(version_) + hint);
    }
    const uint64_t n_tensors = c.read<uint64_t>([] { return std::string("the tensor count"); });
    const uint64_t n_kv = c.read<uint64_t>([] { return std::string("the metadata count"); });
    // Minimum sizes: a key-value pair is a key length (8), a type (4) and at least 1 value byte; a tensor
    // descriptor is a name length (8), n_dims (4), one dim (8), a type (4) and an offset (8).
    if (n_kv > c.remaining() / 13)
      throw error("gguf: metadata count " + std::to_string(n_kv) + " exceeds what the file size allows");
    if (n_tensors > c.remaining() / 32)
      throw error("gguf: tensor count " + std::to_string(n_tensors) + " exceeds what the file size allows");

    for (uint64_t k = 0; k < n_kv; ++k) {
      const uint64_t entry_pos = c.pos();
      std::string key(c.read_string([&] { return "the key of metadata entry " + std::to_string(k); }));
      const uint64_t type_pos = c.pos();
      uint32_t t = c.read<uint32_t>([&] { return "the type of key " + detail::quoted(key); });
      if (!valid_value_type(t))
        throw error("gguf: key " + detail::quoted(key) + ": invalid value type " + std::to_string(t) + " at offset " +
                    std::to_string(type_pos));
      value v;
      read_value(c, static_cast<value_type>(t), v, key, 0);
      if (kv_.count(key))
        throw error("gguf: duplicate metadata key " + detail::quoted(key) + " at offset " + std::to_string(entry_pos));
      kv_.emplace(std::move(key), std::move(v));
    }

    alignment_ = 32;
    if (const value* a = find("general.alignment")) {
      if (a->type != value_type::u32 || a->u == 0 || (a->u & (a->u - 1)) != 0)
        throw error("gguf: general.alignment must be a u32 power of two, got " + describe(*a) +
                    (a->type == value_type::u32 ? " = " + std::to_string(a->u) : ""));
      alignment_ = a->u;
    }

    tensors_.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t k = 0; k < n_tensors; ++k) {
      tensor_info ti;
      const uint64_t pos = c.pos();
      ti.name = std::string(c.read_string([&] { return "the name of tensor " + std::to_string(k); }));
      auto what = [&] { return "the descriptor of tensor " + detail::quoted(ti.name); };
      const uint32_t n_dims = c.read<uint32_t>(what);
      if (n_dims == 0 || n_dims > max_dims)
        throw error("gguf: tensor " + detail::quoted(ti.name) + " has " + std::to_string(n_dims) +
                    " dimensions (1.." + std::to_string(max_dims) + " allowed)");
      ti.ne.resize(n_dims);
      uint64_t n_el = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        ti.ne[d] = c.read<uint64_t>(what);
        // ggml stores ne as int64: anything above INT64_MAX (or a product above it) is corrupt.
        if (ti.ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            (ti.ne[d] != 0 && n_el > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ti.ne[d]))
          throw error("gguf: tensor " + detail::quoted(ti.name) + ": element count overflows");
        n_el *= ti.ne[d];
      }
      const uint32_t type = c.read<uint32_t>(what);
      ti.type = static_cast<ggml_type>(type);
      const type_traits* tr = traits(ti.type);
      if (!tr)
        throw error("gguf: tensor " + detail::quoted(ti.name) + " has unsupported ggml type " + std::to_string(type));
      if (ti.ne[0] % tr->block_size != 0)
        throw error("gguf: tensor " + detail::quoted(ti.name) + ": row length " + std::to_string(ti.ne[0]) +
                    " is not a multiple of the " + tr->name + " block size " + std::to_string(tr->block_size));
      // n_el <= INT64_MAX and block_size >= 1, type_size <= 292: the byte count fits unless n_el is huge.
      const uint64_t n_blocks = n_el / tr->block_size;
      if (n_blocks > std::numeric_limits<uint64_t>::max() / tr->type_size)
        throw error("gguf: tensor " + detail::quoted(ti.name) + ": byte size overflows");
      ti.nbytes = n_blocks * tr->type_size;
      ti.offset = c.read<uint64_t>(what);
      if (ti.offset % alignment_ != 0)
        throw error("gguf: tensor " + detail::quoted(ti.name) + ": data offset " + std::to_string(ti.offset) +
                    " is not a multiple of the alignment " + std::to_string(alignment_));
      if (tensor_index_.count(ti.name))
        throw error("gguf: duplicate tensor name " + detail::quoted(ti.name) + " at offset " + std::to_string(pos));
      tensor_index_.emplace(ti.name, tensors_.size());
      tensors_.push_back(std::move(ti));
    }

    // The data section starts at the next multiple of the alignment after the header.
    const uint64_t header_end = c.pos();
    data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;  // no overflow: header_end <= size
    if (data_offset_ > size && !tensors_.empty())
      throw error("gguf: data section would start at offset " + std::to_string(data_offset_) +
                  " beyond the end of the file (" + std::to_string(size) + " bytes)");
    const uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;
    for (tensor_info& ti : tensors_) {
      if (ti.offset > data_size || ti.nbytes > data_size - ti.offset)
        throw error("gguf: tensor " + detail::quoted(ti.name) + ": data [" + std::to_string(ti.offset) + ", +" +
                    std::to_string(ti.nbytes) + ") lies outside the data section (" + std::to_string(data_size) +
                    " bytes): truncated file?");
      ti.data = base + data_offset_ + ti.offset;
    }
    // No two tensors may share bytes: an aliased or overlapping offset would make one weight read another's data.
    std::vector<const tensor_info*> by_offset;
    for (const tensor_info& ti : tensors_)
      if (ti.nbytes > 0) by_offset.push_back(&ti);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const tensor_info* a, const tensor_info* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); ++k) {
      const tensor_info& a = *by_offset[k - 1];
      const tensor_info& b = *by_offset[k];
      if (b.offset < a.offset + a.nbytes)  // no overflow: both lie inside the data section
        throw error("gguf: tensors " + detail::quoted(a.name) + " (data [" + std::to_string(a.offset) + ", +" +
                    std::to_string(a.nbytes) + ")) and " + detail::quoted(b.name) + " (data [" +
                    std::to_string(b.offset) + ", +" + std::to_string(b.nbytes) + ")) overlap");
    }
  }

  detail::region region_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, value, std::less<>> kv_;
  std::vector<tensor_info> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace llama::gguf
