// The C++ shape of an op schema; the tables themselves are generated from ops/schemas.py.
#pragma once

#include <cstdint>

namespace quest::schema {

enum class Elem { T, TC, Int32, Int8, Float32, Float16 };
enum class AttrKind { Int, Float, String };

struct TensorSpec {
  const char* name;
  Elem elem;
  bool optional;
  int rank;
  const char* dims[4];
};

struct AttrSpec {
  const char* name;
  AttrKind kind;
  bool required;
  int64_t int_default;
  double float_default;
  const char* string_default;
  const char* const* choices;
  int num_choices;
  bool has_minimum;
  double minimum;
  bool has_maximum;
  double maximum;
};

struct SymbolAttr {
  const char* symbol;
  const char* attribute;
};

// Product: a * b; CeilDiv: ceil(a / b); Pick: b when string attribute `when` equals `value`, else a.
enum class DerivedKind { Product, CeilDiv, Pick };

struct DerivedSpec {
  const char* name;
  DerivedKind kind;
  const char* a;
  const char* b;
  const char* when;   // Pick only
  const char* value;  // Pick only
};

struct OpSchema {
  const char* name;
  const TensorSpec* inputs;
  int num_inputs;
  const TensorSpec* outputs;
  int num_outputs;
  const AttrSpec* attributes;
  int num_attributes;
  const SymbolAttr* symbol_attrs;
  int num_symbol_attrs;
  const DerivedSpec* derived;
  int num_derived;
  bool int8_cache;  // TC may also be int8 (SparseBlockAttention's quantized caches, the others' int8 block bounds)
};

}  // namespace quest::schema
