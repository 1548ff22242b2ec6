// fairkv's Python module: fairkv.plan() and fairkv.compact() over numpy arrays and torch CPU tensors, zero-copy
// (nanobind ndarray: DLPack or the buffer protocol), by the same headers as the C++ library. Python only turns
// arguments into views and library statuses into exceptions; every check of a plan request is the library's.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "fairkv/cpu/compact.hpp"
#include "fairkv/cpu/kernel_isa.hpp"
#include "fairkv/registry.hpp"
#include "request.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace fairkv::python {
namespace {

// fairkv.Error: a ValueError carrying the library's status name in `.status`. A plain reference, never released:
// a static nb::object would be released after the interpreter is gone.
PyObject* error_type = nullptr;

[[noreturn]] void raise(std::string_view status_name, const std::string& message) {
  nb::object e = nb::handle(error_type)(message);
  e.attr("status") = nb::str(status_name.data(), status_name.size());
  PyErr_SetObject(error_type, e.ptr());
  throw nb::python_error();
}

[[noreturn]] void raise(const result& r) { raise(to_string(r.code()), r.message()); }

[[noreturn]] void raise_argument(const std::string& message) { raise(to_string(status::invalid_argument), message); }

using any_array = nb::ndarray<nb::ro>;
using writable_array = nb::ndarray<>;

std::string py_type_name(nb::handle h) { return nb::cast<std::string>(nb::handle(Py_TYPE(h.ptr())).attr("__name__")); }

// What a numpy-like array holds, for a message: its dtype and whether numpy reads it in native byte order.
std::string dtype_of(nb::handle h) {
  if (!nb::hasattr(h, "dtype")) return {};
  const nb::object dt = h.attr("dtype");
  std::string out = "dtype " + std::string(nb::str(dt).c_str());
  if (nb::hasattr(dt, "byteorder") && nb::cast<std::string>(dt.attr("byteorder")) == ">")
    out += " (big-endian: fairkv reads native byte order; convert with .astype('=f4'))";
  return out;
}

// An array argument, never copied or converted: nanobind's implicit conversion is off, so a float64 array is an
// error rather than a silent float32 copy that compaction would then write into instead of the caller's memory.
any_array as_array(nb::handle h, const char* name) {
  any_array a;
  if (!nb::try_cast(h, a, /*convert=*/false)) {
    // An array nanobind cannot take as it is: a dtype it does not map (object, longdouble, non-native byte order)
    // says so; a tensor that exports nothing readable (e.g. torch's meta device) says where it lives.
    if (const std::string dt = dtype_of(h); !dt.empty() && nb::hasattr(h, "__array_interface__"))
      raise_argument(std::string(name) + " has " + dt + ": fairkv reads float32, float16 or bfloat16 arrays as they "
                     "are, without converting them");
    std::string where;
    if (nb::hasattr(h, "device")) {
      const std::string device = nb::str(nb::object(h.attr("device"))).c_str();
      where = device == "cpu" ? " that exports neither DLPack nor the buffer protocol" : " on device '" + device + "'";
      if (nb::hasattr(h, "requires_grad") && nb::cast<bool>(h.attr("requires_grad")))
        where += " (a tensor that requires grad does not export its memory: pass .detach(), which shares it)";
    }
    raise_argument(std::string(name) + " must be a numpy array or a torch tensor in host memory (anything exporting "
                   "DLPack or the buffer protocol), not a " + py_type_name(h) + where);
  }
  if (a.device_type() != nb::device::cpu::value)
    raise(to_string(status::not_supported),
          std::string(name) + " is not in host memory: the Python module runs on the CPU (move the tensor with "
          ".cpu(), or use the C++ CUDA backend)");
  return a;
}

element element_of(const any_array& a, const char* name) {
  const auto dt = a.dtype();
  if (dt.lanes == 1 && dt.bits == 32 && dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float))
    return element::f32;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float))
    return element::f16;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat))
    return element::bf16;
  raise_argument(std::string(name) + " must be float32, float16 or bfloat16 (code " + std::to_string(dt.code) +
                 ", " + std::to_string(dt.bits) + " bits)");
}

const char* element_name(element e) { return e == element::f32 ? "float32" : e == element::f16 ? "float16" : "bfloat16"; }

template <std::size_t N>
void read_shape(const any_array& a, const char* name, const char* layout, std::int64_t (&shape)[N],
                std::int64_t (&strides)[N]) {
  if (a.ndim() != N)
    raise(to_string(status::invalid_shape),
          std::string(name) + " must have " + std::to_string(N) + " dimensions " + layout + ", not " +
              std::to_string(a.ndim()));
  for (std::size_t i = 0; i < N; ++i) {
    shape[i] = static_cast<std::int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  // numpy reports zero strides for an empty array; the library would call them aliasing, so say what is wrong.
  for (std::size_t i = 0; i < N; ++i)
    if (shape[i] == 0)
      raise(to_string(i == 2 ? status::empty_cache : status::invalid_shape),
            std::string(name) + " is empty: its shape " + layout + " has a zero extent (dimension " +
                std::to_string(i) + ")");
}

raw_view raw_of(const any_array& a, const char* name) {
  raw_view v;
  read_shape(a, name, "[batch, heads, tokens, head_dim]", v.shape, v.strides);
  v.data = a.data();
  return v;
}

// An integer argument as int64: a Python int or anything with __index__ (numpy integer scalars); bool is refused
// (True would be taken as 1 otherwise), as is a value beyond 64 bits.
std::int64_t read_int64(nb::handle h, const std::string& what) {
  std::int64_t v = 0;
  if (PyBool_Check(h.ptr()) || !nb::try_cast(h, v, /*convert=*/false)) {
    // numpy integer scalars are not Python ints but implement __index__.
    if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr())) raise_argument(what + " must be an integer, not " + py_type_name(h));
    const long long x = PyLong_AsLongLong(nb::steal(PyNumber_Index(h.ptr())).ptr());
    if (x == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      raise(to_string(status::out_of_range), what + " does not fit in 64 bits");
    }
    v = x;
  }
  return v;
}

std::int32_t token_index(nb::handle h, const std::string& what) {
  const std::int64_t v = read_int64(h, what);
  if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
    raise(to_string(status::out_of_range), what + " = " + std::to_string(v) + " does not fit a 32-bit token index");
  return static_cast<std::int32_t>(v);
}

// An item of a list of pairs (segments, priorities): a sequence of exactly two elements.
void require_pair(nb::handle item, const std::string& at, const char* pair) {
  if (!PySequence_Check(item.ptr()) || PySequence_Size(item.ptr()) != 2) {
    PyErr_Clear();
    raise_argument(at + " must be a pair " + pair);
  }
}

std::vector<segment> read_segments(nb::handle obj) {
  std::vector<segment> out;
  if (obj.is_none()) return out;
  if (!nb::hasattr(obj, "__iter__")) raise_argument("segments must be a sequence of (begin, end) pairs, not " + py_type_name(obj));
  std::size_t i = 0;
  for (nb::handle item : nb::iter(obj)) {
    const std::string at = "segments[" + std::to_string(i) + "]";
    require_pair(item, at, "(begin, end)");
    out.push_back({token_index(item[0], at + ".begin"), token_index(item[1], at + ".end")});
    ++i;
  }
  return out;
}

std::vector<std::int32_t> read_whitelist(nb::handle obj) {
  std::vector<std::int32_t> out;
  if (obj.is_none()) return out;
  if (!nb::hasattr(obj, "__iter__")) raise_argument("whitelist must be a sequence of token positions, not " + py_type_name(obj));
  std::size_t i = 0;
  for (nb::handle item : nb::iter(obj)) out.push_back(token_index(item, "whitelist[" + std::to_string(i++) + "]"));
  return out;
}

// A float argument: a Python float or int, or anything with __float__ (numpy scalars); bool is refused.
float read_float(nb::handle h, const std::string& what) {
  if (PyBool_Check(h.ptr()) || !(PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr()) || nb::hasattr(h, "__float__")))
    raise_argument(what + " must be a number, not " + py_type_name(h));
  const double v = PyFloat_AsDouble(h.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_argument(what + " is not a number the module can read");
  }
  return static_cast<float>(v);
}

segment_priority read_priority(nb::handle item, const std::string& at) {
  require_pair(item, at, "(weight, floor)");
  return {read_float(item[0], at + ".weight"), read_float(item[1], at + ".floor")};
}

std::vector<segment_priority> read_priorities(nb::handle obj) {
  std::vector<segment_priority> out;
  if (obj.is_none()) return out;
  if (!nb::hasattr(obj, "__iter__"))
    raise_argument("priorities must be a sequence of (weight, floor) pairs, not " + py_type_name(obj));
  std::size_t i = 0;
  for (nb::handle item : nb::iter(obj)) out.push_back(read_priority(item, "priorities[" + std::to_string(i++) + "]"));
  return out;
}

template <class Kind>
Kind parse_name(const std::string& name) {
  Kind k{};
  if (const result r = parse(name, k); !r) raise(r);
  return k;
}

// The default allocator follows from what is given, so plan(keys, segments=...) is fair eviction.
allocator_kind default_allocator(bool has_segments, bool has_whitelist) {
  if (has_segments) return has_whitelist ? allocator_kind::fair_with_whitelist : allocator_kind::fair;
  return has_whitelist ? allocator_kind::whitelist : allocator_kind::uniform;
}

const char* allocator_name(allocator_kind k) {
  const registry::allocator_info* e = registry::info(k);
  return e ? e->name.data() : "uniform";  // names are literals: NUL-terminated
}

// The registry's names in its order, for the package's SCORERS / SELECTORS / ALLOCATORS.
template <class Table>
nb::tuple names_of(const Table& table) {
  nb::list out;
  for (const auto& e : table) out.append(nb::str(e.name.data(), e.name.size()));
  return nb::tuple(out);
}

// The owning plan returned to Python. Its arrays are read-only views whose lifetime is tied to the Plan object.
struct py_plan {
  keep_plan plan;
  std::string description;
};

template <class T, std::size_t N>
nb::ndarray<nb::numpy, const T, nb::ndim<N>> array_of(const py_plan& self, const T* data,
                                                     std::initializer_list<std::size_t> shape) {
  return {data, shape, nb::find(&self)};
}

py_plan plan(nb::handle keys, nb::handle queries, nb::handle scores, std::optional<std::string> scorer,
             const std::string& selector, std::optional<std::string> allocator, nb::handle segments,
             nb::handle whitelist, nb::handle priorities, nb::handle remainder_priority,
             std::optional<double> ratio, nb::handle budget,
             std::int32_t window, std::int32_t kernel, std::int32_t n_sink, std::optional<std::int32_t> sinks,
             std::int32_t boundary, float debias_lambda, float alpha_safeguard, float scale, std::uint32_t seed) {
  plan_request r;
  // The policy, by the names fairkv::dispatch knows.
  const std::string scorer_name = scorer ? *scorer : (scores.is_none() ? "knorm" : "external");
  r.spec.scorer = parse_name<scorer_kind>(scorer_name);
  r.spec.selector = parse_name<selection_kind>(selector);
  r.segments = read_segments(segments);
  r.whitelist = read_whitelist(whitelist);
  const bool weighted = !priorities.is_none() || !remainder_priority.is_none();
  r.spec.allocator = allocator ? parse_name<allocator_kind>(*allocator)
                     : weighted ? allocator_kind::prioritized
                                : default_allocator(!segments.is_none(), !whitelist.is_none());
  // The prioritized allocator's weights, and only its: given to another allocator they would be ignored, and
  // prioritized without them would be fair under another name.
  if (r.spec.allocator == allocator_kind::prioritized) {
    if (!weighted)
      raise_argument("allocator 'prioritized' needs priorities=[(weight, floor), ...], one per segment in the order "
                     "given (and optionally remainder_priority=(weight, floor) for the tokens outside them); without "
                     "them it is 'fair'");
    r.priorities = read_priorities(priorities);  // one per segment: the library checks the count
    r.spec.priorities = r.priorities;
    if (!remainder_priority.is_none()) r.spec.remainder_priority = read_priority(remainder_priority, "remainder_priority");
  } else if (weighted) {
    raise_argument(std::string("priorities and remainder_priority are read only by allocator 'prioritized', not by '") +
                   allocator_name(r.spec.allocator) + "'");
  }
  r.spec.window = window;
  r.spec.kernel = kernel;
  r.spec.n_sink = n_sink;
  if (sinks) r.spec.sinks = r.spec.paper_sinks = *sinks;
  r.spec.boundary = boundary;
  r.spec.lambda = debias_lambda;
  r.spec.alpha_safeguard = alpha_safeguard;
  r.spec.seed = seed;
  r.scale = scale;

  if (ratio.has_value() == !budget.is_none())
    raise_argument("give exactly one of ratio (the fraction of tokens to evict) and budget (tokens to keep)");
  // Checked by the library with the rest of the request (a ratio outside [0, 1), a budget below 1).
  r.target = budget.is_none() ? keep_target::of_ratio(*ratio) : keep_target::of_tokens(read_int64(budget, "budget"));

  // The arrays. Keep the casts alive until planning is done: they hold references to the caller's buffers.
  any_array k, q, s;
  const bool external = r.spec.scorer == scorer_kind::external;
  if (external) {
    if (scores.is_none()) raise(to_string(status::missing_input), "scorer 'external' needs scores [batch, heads, tokens]");
    s = as_array(scores, "scores");
    if (element_of(s, "scores") != element::f32)
      raise_argument(std::string("scores must be float32, not ") + element_name(element_of(s, "scores")));
    std::int64_t shape[3], strides[3];
    read_shape(s, "scores", "[batch, heads, tokens]", shape, strides);
    r.scores = {s.data() == nullptr ? nullptr : static_cast<const float*>(s.data()), shape[0], shape[1], shape[2],
                strides[0], strides[1], strides[2]};
    if (!keys.is_none()) {
      // Keys are optional here (the scores decide); given, they must be the cache the scores describe.
      k = as_array(keys, "keys");
      const raw_view kv = raw_of(k, "keys");
      if (kv.shape[0] != shape[0] || kv.shape[1] != shape[1] || kv.shape[2] != shape[2])
        raise(to_string(status::invalid_shape),
              "scores are [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ", " +
                  std::to_string(shape[2]) + "] but keys are [" + std::to_string(kv.shape[0]) + ", " +
                  std::to_string(kv.shape[1]) + ", " + std::to_string(kv.shape[2]) + ", ...]");
    }
    if (!queries.is_none()) raise_argument("queries are not read by scorer 'external' (the scores decide)");
  } else {
    if (!scores.is_none())
      raise_argument("scores are read only by scorer 'external', not by '" + scorer_name +
                     "' (leave scorer unset to use the scores)");
    if (keys.is_none()) raise(to_string(status::missing_input), "keys [batch, kv_heads, tokens, head_dim] are required");
    k = as_array(keys, "keys");
    r.keys_type = element_of(k, "keys");
    r.keys = raw_of(k, "keys");
    if (!queries.is_none()) {
      q = as_array(queries, "queries");
      if (const element e = element_of(q, "queries"); e != r.keys_type)
        raise_argument(std::string("queries are ") + element_name(e) + " but keys are " + element_name(r.keys_type) +
                       ": give both in one dtype");
      r.queries = raw_of(q, "queries");
    }
  }

  py_plan out;
  result res;
  {
    nb::gil_scoped_release unlocked;
    if (external) res = plan_scores(r, out.plan);
    else if (r.keys_type == element::f32) res = plan_keys<float>(r, out.plan);
    else if (r.keys_type == element::f16) res = plan_keys<half_t>(r, out.plan);
    else res = plan_keys<bfloat16_t>(r, out.plan);
  }
  if (!res) raise(res);
  out.description = scorer_name + " x " + selector + " x " + allocator_name(r.spec.allocator);
  return out;
}

template <class T>
result compact_as(const py_plan& p, const raw_view& k, const raw_view& v) noexcept {
  const auto keys = typed<T>(k), values = typed<T>(v);
  // The library's compaction writes through mutable views; the arrays were checked writable above.
  auto mut = [](kv_view<const T> c) {
    return kv_view<T>{const_cast<T*>(c.data), c.batch,        c.heads,       c.tokens,    c.head_dim,
                      c.stride_batch,         c.stride_head, c.stride_token, c.stride_dim};
  };
  return cpu::compact(p.plan.view(), mut(keys), mut(values));
}

any_array writable(nb::handle h, const char* name) {
  // Compaction writes the memory directly: autograd would neither see the change nor bump the tensor's version
  // counter, so a tensor in a graph (or a leaf that requires grad) would give silently wrong gradients.
  if (nb::hasattr(h, "requires_grad") && nb::cast<bool>(h.attr("requires_grad")))
    raise_argument(std::string(name) + " requires grad: compaction writes it in place behind autograd's back; pass " +
                   name + ".detach() (it shares the memory) if that is what you mean");
  writable_array w;
  if (!nb::try_cast(h, w, /*convert=*/false)) {
    (void)as_array(h, name);  // raises for what is not an array at all, or not on the host
    raise_argument(std::string(name) + " is read-only: compaction works in place on the caller's memory");
  }
  return as_array(h, name);
}

void compact(const py_plan& p, nb::handle keys, nb::handle values) {
  const any_array k = writable(keys, "keys"), v = writable(values, "values");
  const element ek = element_of(k, "keys"), ev = element_of(v, "values");
  if (ek != ev)
    raise_argument(std::string("keys are ") + element_name(ek) + " but values are " + element_name(ev) +
                   ": compaction moves both in one dtype");
  const raw_view rk = raw_of(k, "keys"), rv = raw_of(v, "values");
  result res;
  {
    nb::gil_scoped_release unlocked;
    res = ek == element::f32   ? compact_as<float>(p, rk, rv)
          : ek == element::f16 ? compact_as<half_t>(p, rk, rv)
                               : compact_as<bfloat16_t>(p, rk, rv);
  }
  if (!res) raise(res);
}

}  // namespace
}  // namespace fairkv::python

NB_MODULE(_fairkv, m) {
  using namespace fairkv::python;
  m.doc() = "fairkv's C++ core (see the fairkv package for the documented API).";
  error_type = PyErr_NewExceptionWithDoc(
      "fairkv.Error",
      "A request fairkv refused. A ValueError whose message is the library's; `.status` names the library status "
      "(e.g. 'budget exceeded', 'invalid shape'). Nothing of the caller's arrays was modified.",
      PyExc_ValueError, nullptr);
  if (error_type == nullptr) throw nb::python_error();
  m.attr("Error") = nb::handle(error_type);
  m.attr("SCORERS") = names_of(fairkv::registry::builtin_scorers);
  m.attr("SELECTORS") = names_of(fairkv::registry::builtin_selectors);
  m.attr("ALLOCATORS") = names_of(fairkv::registry::builtin_allocators);

  nb::class_<py_plan>(m, "Plan",
                      "A keep plan: for every (batch, KV head) row, the kept token indices in ascending order.")
      .def_prop_ro(
          "indices",
          [](const py_plan& self) {
            return array_of<std::int32_t, 3>(self, self.plan.view().indices,
                                             {std::size_t(self.plan.batch()), std::size_t(self.plan.heads()),
                                              std::size_t(self.plan.capacity())});
          },
          "int32 [batch, heads, capacity]: row (b, h) keeps indices[b, h, :counts[b, h]], ascending (read-only)")
      .def_prop_ro(
          "counts",
          [](const py_plan& self) {
            return array_of<std::int32_t, 2>(self, self.plan.view().counts,
                                             {std::size_t(self.plan.batch()), std::size_t(self.plan.heads())});
          },
          "int32 [batch, heads]: tokens kept per row (read-only)")
      .def_prop_ro(
          "lengths",
          [](const py_plan& self) {
            return array_of<std::int32_t, 1>(self, self.plan.view().lengths, {std::size_t(self.plan.batch())});
          },
          "int32 [batch]: the sequence length the plan was made for (read-only)")
      .def_prop_ro("batch", [](const py_plan& self) { return self.plan.batch(); })
      .def_prop_ro("heads", [](const py_plan& self) { return self.plan.heads(); })
      .def_prop_ro("capacity", [](const py_plan& self) { return self.plan.capacity(); })
      .def_prop_ro("applied", [](const py_plan& self) { return self.plan.applied(); },
                   "whether fairkv.compact has applied this plan (a plan is applied once)")
      .def_prop_ro("policy", [](const py_plan& self) { return self.description; },
                   "scorer x selector x allocator, as planned")
      .def(
          "kept",
          [](const py_plan& self, std::int64_t b, std::int64_t h) {
            if (b < 0 || b >= self.plan.batch() || h < 0 || h >= self.plan.heads())
              raise(fairkv::to_string(fairkv::status::out_of_range),
                    "kept(" + std::to_string(b) + ", " + std::to_string(h) + ") is outside the plan's [" +
                        std::to_string(self.plan.batch()) + ", " + std::to_string(self.plan.heads()) + "] rows");
            const auto v = self.plan.view();
            return array_of<std::int32_t, 1>(self, v.row(b, h), {std::size_t(self.plan.count(b, h))});
          },
          "b"_a, "h"_a, "The kept token indices of row (b, h), ascending (a read-only view into the plan).")
      .def("__repr__", [](const py_plan& self) {
        return "<fairkv.Plan " + self.description + ": batch " + std::to_string(self.plan.batch()) + ", heads " +
               std::to_string(self.plan.heads()) + ", capacity " + std::to_string(self.plan.capacity()) + ">";
      });

  m.def("plan", &plan, "keys"_a = nb::none(), nb::kw_only(), "queries"_a = nb::none(), "scores"_a = nb::none(),
        "scorer"_a = nb::none(), "selector"_a = "per_head", "allocator"_a = nb::none(), "segments"_a = nb::none(),
        "whitelist"_a = nb::none(), "priorities"_a = nb::none(), "remainder_priority"_a = nb::none(),
        "ratio"_a = nb::none(), "budget"_a = nb::none(), "window"_a = 64, "kernel"_a = 5,
        "n_sink"_a = 4, "sinks"_a = nb::none(), "boundary"_a = 0, "debias_lambda"_a = 1.0f,
        "alpha_safeguard"_a = 0.2f, "scale"_a = 0.0f, "seed"_a = 0u, "Plans one layer (see fairkv.plan).");
  m.def("compact", &compact, "plan"_a, "keys"_a, "values"_a, "Compacts keys and values in place (see fairkv.compact).");
  m.def(
      "attention_kernel_isa", [] { return std::string(fairkv::cpu::attention_kernel_isa()); },
      "The instruction set the attention scorers run (see fairkv.attention_kernel_isa).");
}
