// The one place where runtime choices (policy names from a CLI or a config file) become compile-time policies.
// `dispatch(spec, f)` calls f(policy<...>{...}) with the instantiation the spec names, so only the call sites
// that really need runtime choice pay for instantiating the combinations. The built-ins it can name, their names
// and how each is made from the spec are the registry's (registry.hpp); nothing here lists them again.
#pragma once

#include <string_view>

#include "fairkv/policy.hpp"
#include "fairkv/policy_spec.hpp"
#include "fairkv/registry.hpp"
#include "fairkv/status.hpp"

namespace fairkv {

namespace detail {
template <class Table, class Kind>
[[nodiscard]] result parse_name(const Table& table, std::string_view name, Kind& out, const char* what,
                                const char* names) noexcept {
  if (const auto* e = registry::lookup(table, name)) {
    out = e->kind;
    return {};
  }
  return result::error(status::invalid_argument, "unknown %s '%.*s' (%s)", what, static_cast<int>(name.size()),
                       name.data(), names);
}
}  // namespace detail

// A name (or alias) of the registry to its kind; the error lists the valid names.
[[nodiscard]] inline result parse(std::string_view name, scorer_kind& out) noexcept {
  return detail::parse_name(registry::builtin_scorers, name, out, "scorer", registry::scorer_names.data());
}
[[nodiscard]] inline result parse(std::string_view name, selection_kind& out) noexcept {
  return detail::parse_name(registry::builtin_selectors, name, out, "selector", registry::selector_names.data());
}
[[nodiscard]] inline result parse(std::string_view name, allocator_kind& out) noexcept {
  return detail::parse_name(registry::builtin_allocators, name, out, "allocator", registry::allocator_names.data());
}

namespace detail {

// f(Entry{}) for the entry of `kind` in the list; the first entry for a value that is no enumerator.
template <class First, class Kind, class F>
decltype(auto) visit_entry(registry::list<>, Kind, F& f) {
  return f(First{});
}
template <class First, class E, class... Rest, class Kind, class F>
decltype(auto) visit_entry(registry::list<E, Rest...>, Kind kind, F& f) {
  if (kind == E::kind) return f(E{});
  return visit_entry<First>(registry::list<Rest...>{}, kind, f);
}
template <class First, class... E, class Kind, class F>
decltype(auto) visit_kind(registry::list<First, E...> entries, Kind kind, F& f) {
  return visit_entry<First>(entries, kind, f);
}

template <class S, class Sel, class F>
decltype(auto) dispatch_allocator(const policy_spec& spec, S s, Sel sel, F&& f) {
  auto make = [&](auto entry) -> decltype(auto) {
    using A = typename decltype(entry)::type;
    return f(policy<S, Sel, A>{s, sel, decltype(entry)::make(spec)});
  };
  return visit_kind(registry::allocators{}, spec.allocator, make);
}

template <class S, class F>
decltype(auto) dispatch_selector(const policy_spec& spec, S s, F&& f) {
  auto next = [&](auto entry) -> decltype(auto) { return dispatch_allocator(spec, s, decltype(entry)::make(spec), f); };
  return visit_kind(registry::selectors{}, spec.selector, next);
}

}  // namespace detail

// f must return the same type for every policy (typically fairkv::result).
template <class F>
decltype(auto) dispatch(const policy_spec& spec, F&& f) {
  auto next = [&](auto entry) -> decltype(auto) { return detail::dispatch_selector(spec, decltype(entry)::make(spec), f); };
  return detail::visit_kind(registry::scorers{}, spec.scorer, next);
}

}  // namespace fairkv
