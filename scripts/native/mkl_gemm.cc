// XLA FFI handler: a float32 matrix product through MKL's cblas_sgemm, for the training-step
// experiment in scripts/native_gemm.py (not part of the `vit` package). Row-major 2-D operands;
// `ta`/`tb` read a or b transposed, so both gradient products need no copy.
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// MKL's CBLAS, resolved at load time against libmkl_rt (loaded RTLD_GLOBAL before this).
extern "C" void cblas_sgemm(int layout, int transa, int transb, int m, int n, int k,
                            float alpha, const float* a, int lda, const float* b, int ldb,
                            float beta, float* c, int ldc);

namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

ffi::Error Sgemm(ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                 ffi::ResultBuffer<ffi::F32> c, bool ta, bool tb) {
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  if (ad.size() != 2 || bd.size() != 2) {
    return ffi::Error::InvalidArgument("mkl_sgemm: operands must be 2-D");
  }
  const int64_t m = ta ? ad[1] : ad[0], k = ta ? ad[0] : ad[1];
  const int64_t n = tb ? bd[0] : bd[1];
  if ((tb ? bd[1] : bd[0]) != k) {
    return ffi::Error::InvalidArgument("mkl_sgemm: contracting dimensions differ");
  }
  cblas_sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, 1.f,
              a.typed_data(), ad[1], b.typed_data(), bd[1], 0.f, c->typed_data(), n);
  return ffi::Error::Success();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MklSgemm, Sgemm,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("ta")
                                  .Attr<bool>("tb"));
