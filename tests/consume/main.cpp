// The whole consumer program of tests/consume/*: it only has to compile against kiln's
// headers, link with what kiln::kiln brings, and compute something.
#include <kiln/core/dtype.hpp>

#include <cstdio>

int main() {
  const kiln::DType t = kiln::promote_types(kiln::i32, kiln::f32);
  std::printf("kiln consumer: promote_types(i32, f32) = %s\n", kiln::dtype_name(t));
  return t == kiln::f32 ? 0 : 1;
}
