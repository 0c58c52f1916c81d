// The SAM client step of a group of clients for the NCF model, one client at a time, summed
// over clients for the aggregate path (fedrecgel/native/__init__.py explains when it is used).
//
// For each client, all three passes run back to back on its own rows, so the activations of
// a pass are still in the core's cache when the next step reads them: bias, ReLU, its mask,
// the loss and the gathers are loops over a few hundred KB instead of separate passes over
// the whole group's activations, and the only library calls are the matrix products. The
// maths is fedrecgel/passes.py's (a test holds the two to the same results):
//
//   pass 1  forward and backward at (w, u_c): g_sh (item rows per (client, item) pair and the
//           dense score network), g_ns (the private rows)
//   pass 2  forward and backward at (w + rho_sh g_sh/||g_sh||, u_c), its dense gradient
//           scaled by the client's weight a_c and summed over clients; its item-row
//           gradients written per sample, for the caller to add into the item tables
//   pass 3  forward and backward of the private part at (w, u_c + rho_ns g_ns/||g_ns||),
//           reusing pass 1's item half of the first layer (skipped when rho_ns = 0: g_ns)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

using at::Tensor;

namespace {

// Reductions carry `omp simd reduction` so the compiler may reorder their sums into vector
// lanes (without it, each add waits for the previous one).
inline float dot(const float* a, const float* b, int64_t m) {
  float v = 0.f;
#pragma omp simd reduction(+ : v)
  for (int64_t j = 0; j < m; ++j) v += a[j] * b[j];
  return v;
}

// y (n x m) = d (n) outer v (m)
inline void outer(const float* d, const float* v, int64_t n, int64_t m, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = d[i];
    float* yi = y + i * m;
    for (int64_t j = 0; j < m; ++j) yi[j] = s * v[j];
  }
}

// x where h > 0, else 0: the ReLU's backward, in place
inline void mask(float* x, const float* h, int64_t len) {
  for (int64_t i = 0; i < len; ++i) x[i] = h[i] > 0.f ? x[i] : 0.f;
}

// out (m) (+)= the sum of x's n rows (n x m)
inline void colsum(const float* x, int64_t n, int64_t m, float* out, bool acc) {
  if (!acc) std::fill(out, out + m, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * m;
    for (int64_t j = 0; j < m; ++j) out[j] += xi[j];
  }
}

// out (m) (+)= sum_i d[i] x[i, :] (x: n x m)
inline void wsum(const float* d, const float* x, int64_t n, int64_t m, float* out, bool acc) {
  if (!acc) std::fill(out, out + m, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const float s = d[i];
    const float* xi = x + i * m;
    for (int64_t j = 0; j < m; ++j) out[j] += s * xi[j];
  }
}

// out (m) = w (h x m, rows of stride ld) transposed times s (h): sum_r s[r] w[r, :]
inline void tmatvec(const float* w, int64_t ld, const float* s, int64_t h, int64_t m,
                    float* out) {
  std::fill(out, out + m, 0.f);
  for (int64_t r = 0; r < h; ++r) {
    const float sr = s[r];
    const float* wr = w + r * ld;
    for (int64_t j = 0; j < m; ++j) out[j] += sr * wr[j];
  }
}

// the user half of the first layer's weight gradient: out[r, :E] (+)= s[r] u (rows of
// stride ld, h of them)
inline void user_half(const float* s, const float* u, int64_t h, int64_t e, int64_t ld,
                      float* out, bool acc) {
  for (int64_t r = 0; r < h; ++r) {
    float* o = out + r * ld;
    for (int64_t j = 0; j < e; ++j) o[j] = (acc ? o[j] : 0.f) + s[r] * u[j];
  }
}

// out (h) = b + w (h x m, rows of stride ld) times x (m)
inline void matvec(const float* w, int64_t ld, const float* x, const float* b, int64_t h,
                   int64_t m, float* out) {
  for (int64_t r = 0; r < h; ++r) {
    out[r] = b[r] + dot(w + r * ld, x, m);
  }
}

// y (n x m) = relu(x + r) for a row vector r (m); y may be x
inline void bias_relu(const float* x, const float* r, int64_t n, int64_t m, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * m;
    float* yi = y + i * m;
    for (int64_t j = 0; j < m; ++j) {
      const float v = xi[j] + r[j];
      yi[j] = v > 0.f ? v : 0.f;
    }
  }
}

inline double sumsq(const float* x, int64_t len) {
  return dot(x, x, len);
}

// y = a + f x (len floats; y may be x)
inline void axpy_to(const float* a, float f, const float* x, int64_t len, float* y) {
  for (int64_t i = 0; i < len; ++i) y[i] = a[i] + f * x[i];
}

// an (n x m) row-major tensor over p (rows of stride ld); no copy
inline Tensor view(const float* p, int64_t n, int64_t m, int64_t ld) {
  return at::from_blob(const_cast<float*>(p), {n, m}, {ld, 1},
                       at::TensorOptions().dtype(at::kFloat));
}

// the transpose of that (n x m) matrix: an (m x n) tensor over the same floats
inline Tensor tview(const float* p, int64_t n, int64_t m, int64_t ld) {
  return at::from_blob(const_cast<float*>(p), {m, n}, {1, ld},
                       at::TensorOptions().dtype(at::kFloat));
}

inline float* fp(const Tensor& t) { return t.data_ptr<float>(); }

// the first n rows of a row-major matrix (no dispatcher call, unlike narrow)
inline Tensor rows(const Tensor& t, int64_t n) { return view(fp(t), n, t.size(1), t.size(1)); }

// columns [j, j + len) of a row-major matrix
inline Tensor cols(const Tensor& t, int64_t j, int64_t len) {
  return view(fp(t) + j, t.size(0), len, t.size(1));
}

struct Model {
  int64_t L, F, E, H0, HL, ld0;  // layers, GMF factor, MLP embedding, widths, tower.0 row
  std::vector<int64_t> width;    // output width of each tower layer
  std::vector<Tensor> W, B;      // tower weights (out x in) and biases
  const float* wp;               // predict weight (F + HL): GMF part, then the tower's
  float bp;
};

// What one thread keeps while it goes through its clients: the dense gradient of the
// current client (then its perturbed weights), the activations of a pass, and its share of
// the aggregate dense gradient.
struct Work {
  std::vector<Tensor> dW, db, acc_W, acc_b, h;
  Tensor bias2, dwp, wp2, acc_wp, rows_g, rows_m, ig, im, ig2, im2, gmf, first, bufA, bufB,
      dlog, vec, vec2;
  double acc_bp = 0.0;

  Work(const Model& m, int64_t n_max, int64_t p_max) {
    auto opt = at::TensorOptions().dtype(at::kFloat);
    int64_t wmax = std::max(m.E, m.F);
    for (int64_t k = 0; k < m.L; ++k) {
      dW.push_back(at::empty_like(m.W[k]));
      db.push_back(at::empty_like(m.B[k]));
      acc_W.push_back(at::zeros_like(m.W[k]));
      acc_b.push_back(at::zeros_like(m.B[k]));
      h.push_back(at::empty({n_max, m.width[k]}, opt));
      wmax = std::max(wmax, m.width[k]);
    }
    bias2 = at::empty({m.L, wmax}, opt);
    dwp = at::empty({m.F + m.HL}, opt);
    wp2 = at::empty({m.F + m.HL}, opt);
    acc_wp = at::zeros({m.F + m.HL}, opt);
    rows_g = at::empty({p_max, m.F}, opt);
    rows_m = at::empty({p_max, m.E}, opt);
    ig = at::empty({n_max, m.F}, opt);
    im = at::empty({n_max, m.E}, opt);
    ig2 = at::empty({n_max, m.F}, opt);
    im2 = at::empty({n_max, m.E}, opt);
    gmf = at::empty({n_max, m.F}, opt);
    first = at::empty({n_max, m.H0}, opt);
    bufA = at::empty({n_max, wmax}, opt);
    bufB = at::empty({n_max, wmax}, opt);
    dlog = at::empty({n_max}, opt);
    vec = at::empty({wmax}, opt);
    vec2 = at::empty({wmax}, opt);
  }
};

// The tower's forward for n rows: h[0] = relu(first + uh), h[k] = relu(h[k-1] W_k^T + b_k),
// with W_k from `weights` (the model's or a perturbed copy) and b_k from `biases` (k >= 1).
void tower(const Model& m, Work& w, int64_t n, const float* first, const float* uh,
           const std::vector<const float*>& weights, const std::vector<const float*>& biases) {
  bias_relu(first, uh, n, m.H0, fp(w.h[0]));
  for (int64_t k = 1; k < m.L; ++k) {
    Tensor out = rows(w.h[k], n);
    at::mm_out(out, rows(w.h[k - 1], n),
               tview(weights[k], m.width[k], m.width[k - 1], m.width[k - 1]));
    bias_relu(fp(out), biases[k], n, m.width[k], fp(out));
  }
}

// d loss / d logit of each row (scaled by `scale`), and the summed loss when `loss` is given:
// the chunked loss's weights lw, labels y.
void logits_grad(const Model& m, const Work& w, int64_t n, const float* gmf, const float* wpv,
                 float bpv, const float* y, const float* lw, float scale, float* d, float* loss) {
  const float* hL = fp(w.h[m.L - 1]);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float z = bpv + dot(gmf + i * m.F, wpv, m.F) + dot(hL + i * m.HL, wpv + m.F, m.HL);
    if (loss != nullptr) {
      const float bce = std::max(z, 0.f) - z * y[i] + std::log1p(std::exp(-std::fabs(z)));
      total += static_cast<double>(bce) * lw[i];
    }
    const float sig = 1.f / (1.f + std::exp(-z));
    d[i] = (sig - y[i]) * lw[i] * scale;
  }
  if (loss != nullptr) *loss = static_cast<float>(total);
}

// Backward of the tower from d logit down to the first layer's pre-activation: returns the
// buffer holding d pre-activation of layer 0 (n x H0). With `gW`, each layer k >= 1 adds its
// weight and bias gradients there (accumulate or overwrite).
float* tower_back(const Model& m, Work& w, int64_t n, const float* d, const float* wpv,
                  const std::vector<const float*>& weights, std::vector<Tensor>* gW,
                  std::vector<Tensor>* gb, bool acc) {
  float* dpre = fp(w.bufA);
  float* dx = fp(w.bufB);
  outer(d, wpv + m.F, n, m.HL, dpre);
  mask(dpre, fp(w.h[m.L - 1]), n * m.HL);
  for (int64_t k = m.L - 1; k >= 1; --k) {
    const int64_t wo = m.width[k], wi = m.width[k - 1];
    Tensor tdpre = view(dpre, n, wo, wo);
    Tensor hprev = rows(w.h[k - 1], n);
    if (gW != nullptr) {
      if (acc) {
        (*gW)[k].addmm_(tview(dpre, n, wo, wo), hprev);
      } else {
        at::mm_out((*gW)[k], tview(dpre, n, wo, wo), hprev);
      }
      colsum(dpre, n, wo, fp((*gb)[k]), acc);
    }
    Tensor tdx = view(dx, n, wi, wi);
    at::mm_out(tdx, tdpre, view(weights[k], wo, wi, wi));
    mask(dx, fp(hprev), n * wi);
    std::swap(dpre, dx);
  }
  return dpre;
}

// The private gradients of a pass at the model's shared weights: user_gmf's from d logit
// (n) and the samples' GMF item rows ig (n x F), user_mlp's from the summed d pre-activation
// of the first layer s (H0) through its user half.
void private_grads(const Model& m, int64_t n, const float* dl, const float* ig, const float* s,
                   const float* W0, float* gug, float* gum) {
  tmatvec(W0, m.ld0, s, m.H0, m.E, gum);
  std::fill(gug, gug + m.F, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const float dli = dl[i];
    for (int64_t j = 0; j < m.F; ++j) gug[j] += dli * m.wp[j] * ig[i * m.F + j];
  }
}

struct Group {
  const int64_t *off, *poff, *sp, *pit, *itm;
  const float *y, *lw, *aw, *ug, *um, *item_gmf, *item_mlp;
  double rho_sh, rho_ns;
  float *row_gmf, *row_mlp, *g_ug, *g_um, *loss;
};

void client(const Model& m, const Group& g, Work& w, int64_t c) {
  const int64_t a = g.off[c], n = g.off[c + 1] - a;
  const int64_t pa = g.poff[c], p = g.poff[c + 1] - pa;
  const int64_t F = m.F, E = m.E, H0 = m.H0, HL = m.HL, L = m.L;
  const float* ugc = g.ug + c * F;
  const float* umc = g.um + c * E;
  const float* y = g.y + a;
  const float* lw = g.lw + a;
  const int64_t* itm = g.itm + a;
  float* ig = fp(w.ig);
  float* im = fp(w.im);
  float* gmf = fp(w.gmf);
  float* first = fp(w.first);
  float* dl = fp(w.dlog);
  float* uh = fp(w.vec);
  std::vector<const float*> Wm(L), Bm(L);
  for (int64_t k = 0; k < L; ++k) {
    Wm[k] = fp(m.W[k]);
    Bm[k] = fp(m.B[k]);
  }
  const float* W0 = Wm[0];

  // ---- pass 1 forward at (w, u_c)
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(g.item_gmf + itm[i] * F, F, ig + i * F);
    std::copy_n(g.item_mlp + itm[i] * E, E, im + i * E);
    for (int64_t j = 0; j < F; ++j) gmf[i * F + j] = ugc[j] * ig[i * F + j];
  }
  Tensor tfirst = rows(w.first, n);
  Tensor tim = rows(w.im, n);
  at::mm_out(tfirst, tim, tview(W0 + E, H0, E, m.ld0));  // item half, kept for pass 3
  matvec(W0, m.ld0, umc, Bm[0], H0, E, uh);                  // user half + bias
  tower(m, w, n, first, uh, Wm, Bm);
  logits_grad(m, w, n, gmf, m.wp, m.bp, y, lw, 1.f, dl, g.loss + c);

  // ---- pass 1 backward: the client's shared gradient g_sh and private gradient g_ns
  float* dwp = fp(w.dwp);
  wsum(dl, gmf, n, F, dwp, false);
  wsum(dl, fp(w.h[L - 1]), n, HL, dwp + F, false);
  float dbp = 0.f;
  for (int64_t i = 0; i < n; ++i) dbp += dl[i];
  float* dpre = tower_back(m, w, n, dl, m.wp, Wm, &w.dW, &w.db, false);
  float* s = fp(w.vec2);
  colsum(dpre, n, H0, s, false);
  user_half(s, umc, H0, E, m.ld0, fp(w.dW[0]), false);
  Tensor tdpre = view(dpre, n, H0, H0);
  Tensor dW0i = cols(w.dW[0], E, m.ld0 - E);
  at::mm_out(dW0i, tview(dpre, n, H0, H0), tim);
  std::copy_n(s, H0, fp(w.db[0]));
  float* dx = dpre == fp(w.bufA) ? fp(w.bufB) : fp(w.bufA);
  Tensor tdim = view(dx, n, E, E);
  at::mm_out(tdim, tdpre, view(W0 + E, H0, E, m.ld0));
  float* rg = fp(w.rows_g);
  float* rm = fp(w.rows_m);
  std::fill(rg, rg + p * F, 0.f);
  std::fill(rm, rm + p * E, 0.f);
  for (int64_t i = 0; i < n; ++i) {  // item-row gradients, summed per (client, item) pair
    const int64_t q = g.sp[a + i] - pa;
    const float* di = dx + i * E;
    float* r = rm + q * E;
    for (int64_t j = 0; j < E; ++j) r[j] += di[j];
    float* rgq = rg + q * F;
    const float dli = dl[i];
    for (int64_t j = 0; j < F; ++j) rgq[j] += dli * m.wp[j] * ugc[j];
  }
  float* gum = g.g_um + c * E;
  float* gug = g.g_ug + c * F;
  private_grads(m, n, dl, ig, s, W0, gug, gum);

  // ---- the shared perturbation e_sh = rho_sh g_sh / (||g_sh|| + 1e-12), written over g_sh
  double sq = sumsq(rg, p * F) + sumsq(rm, p * E) + sumsq(dwp, F + HL) +
              static_cast<double>(dbp) * dbp;
  for (int64_t k = 0; k < L; ++k)
    sq += sumsq(fp(w.dW[k]), w.dW[k].numel()) + sumsq(fp(w.db[k]), m.width[k]);
  const float f = static_cast<float>(g.rho_sh / (std::sqrt(sq) + 1e-12));
  std::vector<const float*> W2(L), B2(L);
  for (int64_t k = 0; k < L; ++k) {
    float* wk = fp(w.dW[k]);
    axpy_to(Wm[k], f, wk, w.dW[k].numel(), wk);
    float* bk = fp(w.bias2) + k * w.bias2.size(1);
    axpy_to(Bm[k], f, fp(w.db[k]), m.width[k], bk);
    W2[k] = wk;
    B2[k] = bk;
  }
  float* wp2 = fp(w.wp2);
  axpy_to(m.wp, f, dwp, F + HL, wp2);
  const float bp2 = m.bp + f * dbp;
  for (int64_t q = 0; q < p; ++q) {
    const int64_t it = g.pit[pa + q];
    axpy_to(g.item_gmf + it * F, f, rg + q * F, F, rg + q * F);
    axpy_to(g.item_mlp + it * E, f, rm + q * E, E, rm + q * E);
  }

  // ---- pass 2 forward at the perturbed point
  float* ig2 = fp(w.ig2);
  float* im2 = fp(w.im2);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t q = g.sp[a + i] - pa;
    std::copy_n(rg + q * F, F, ig2 + i * F);
    std::copy_n(rm + q * E, E, im2 + i * E);
    for (int64_t j = 0; j < F; ++j) gmf[i * F + j] = ugc[j] * ig2[i * F + j];
  }
  Tensor tim2 = rows(w.im2, n);
  float* first2 = fp(w.bufA);
  Tensor tfirst2 = view(first2, n, H0, H0);
  at::mm_out(tfirst2, tim2, tview(W2[0] + E, H0, E, m.ld0));
  matvec(W2[0], m.ld0, umc, B2[0], H0, E, uh);
  tower(m, w, n, first2, uh, W2, B2);
  logits_grad(m, w, n, gmf, wp2, bp2, y, lw, g.aw[c], dl, nullptr);

  // ---- pass 2 backward: a_c times the upload, summed over clients
  wsum(dl, gmf, n, F, fp(w.acc_wp), true);
  wsum(dl, fp(w.h[L - 1]), n, HL, fp(w.acc_wp) + F, true);
  for (int64_t i = 0; i < n; ++i) w.acc_bp += dl[i];
  float* rgs = g.row_gmf + a * F;
  for (int64_t i = 0; i < n; ++i) {
    const float dli = dl[i];
    for (int64_t j = 0; j < F; ++j) rgs[i * F + j] = dli * wp2[j] * ugc[j];
  }
  dpre = tower_back(m, w, n, dl, wp2, W2, &w.acc_W, &w.acc_b, true);
  colsum(dpre, n, H0, s, false);
  user_half(s, umc, H0, E, m.ld0, fp(w.acc_W[0]), true);
  colsum(dpre, n, H0, fp(w.acc_b[0]), true);
  tdpre = view(dpre, n, H0, H0);
  cols(w.acc_W[0], E, m.ld0 - E).addmm_(tview(dpre, n, H0, H0), tim2);
  Tensor trm = view(g.row_mlp + a * E, n, E, E);
  at::mm_out(trm, tdpre, view(W2[0] + E, H0, E, m.ld0));

  // ---- pass 3: the private gradient at (w, u_c + rho_ns g_ns / (||g_ns|| + 1e-12))
  if (g.rho_ns <= 0.0) return;
  const double sq3 = sumsq(gug, F) + sumsq(gum, E);
  const float f3 = static_cast<float>(g.rho_ns / (std::sqrt(sq3) + 1e-12));
  float* ug3 = fp(w.wp2);  // free again: F + HL >= F floats
  axpy_to(ugc, f3, gug, F, ug3);
  float* um3 = fp(w.bias2);  // free again: L x wmax >= E floats
  axpy_to(umc, f3, gum, E, um3);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < F; ++j) gmf[i * F + j] = ug3[j] * ig[i * F + j];
  matvec(W0, m.ld0, um3, Bm[0], H0, E, uh);
  tower(m, w, n, first, uh, Wm, Bm);
  logits_grad(m, w, n, gmf, m.wp, m.bp, y, lw, 1.f, dl, nullptr);
  dpre = tower_back(m, w, n, dl, m.wp, Wm, nullptr, nullptr, false);
  colsum(dpre, n, H0, s, false);
  private_grads(m, n, dl, ig, s, W0, gug, gum);
}

void check_float(const Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == dim, name,
              " must be a contiguous float32 tensor of ", dim, " dimensions");
}

void check_long(const Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.dim() == 1, name,
              " must be a contiguous int64 vector");
}

}  // namespace

void ncf_group_step(const Tensor& offsets, const Tensor& pair_offsets, const Tensor& sample_pair,
                    const Tensor& pair_items, const Tensor& items, const Tensor& labels,
                    const Tensor& lweights, const Tensor& client_w, const Tensor& ug,
                    const Tensor& um, at::TensorList W, at::TensorList B, const Tensor& wp,
                    const Tensor& bp, const Tensor& item_gmf, const Tensor& item_mlp,
                    double rho_sh, double rho_ns, at::TensorList acc_W, at::TensorList acc_b,
                    const Tensor& acc_wp, const Tensor& acc_bp, const Tensor& row_gmf,
                    const Tensor& row_mlp, const Tensor& g_ug, const Tensor& g_um,
                    const Tensor& loss) {
  for (const auto& [t, name] : {std::pair{&offsets, "offsets"}, {&pair_offsets, "pair_offsets"},
                                {&sample_pair, "sample_pair"}, {&pair_items, "pair_items"},
                                {&items, "items"}})
    check_long(*t, name);
  for (const auto& [t, name] : {std::pair{&labels, "labels"}, {&lweights, "lweights"},
                                {&client_w, "client_w"}, {&wp, "wp"}, {&bp, "bp"},
                                {&acc_wp, "acc_wp"}, {&acc_bp, "acc_bp"}, {&loss, "loss"}})
    check_float(*t, name, 1);
  for (const auto& [t, name] : {std::pair{&ug, "ug"}, {&um, "um"}, {&item_gmf, "item_gmf"},
                                {&item_mlp, "item_mlp"}, {&row_gmf, "row_gmf"},
                                {&row_mlp, "row_mlp"}, {&g_ug, "g_ug"}, {&g_um, "g_um"}})
    check_float(*t, name, 2);
  Model m;
  m.L = static_cast<int64_t>(W.size());
  TORCH_CHECK(m.L >= 1 && B.size() == W.size() && acc_W.size() == W.size() &&
                  acc_b.size() == W.size(), "one weight, bias and accumulator per layer");
  const int64_t C = offsets.numel() - 1;
  m.F = ug.size(1);
  m.E = um.size(1);
  for (int64_t k = 0; k < m.L; ++k) {
    check_float(W[k], "W", 2);
    check_float(B[k], "B", 1);
    check_float(acc_W[k], "acc_W", 2);
    check_float(acc_b[k], "acc_b", 1);
    m.W.push_back(W[k]);
    m.B.push_back(B[k]);
    m.width.push_back(W[k].size(0));
  }
  m.H0 = m.width[0];
  m.HL = m.width[m.L - 1];
  m.ld0 = W[0].size(1);
  TORCH_CHECK(m.ld0 == 2 * m.E && wp.numel() == m.F + m.HL && bp.numel() == 1,
              "model shapes do not match");
  m.wp = fp(wp);
  m.bp = fp(bp)[0];
  const int64_t N = items.numel();
  TORCH_CHECK(pair_offsets.numel() == C + 1 && client_w.numel() == C && ug.size(0) == C &&
                  um.size(0) == C && labels.numel() == N && lweights.numel() == N &&
                  sample_pair.numel() == N && row_gmf.size(0) == N && row_mlp.size(0) == N &&
                  g_ug.size(0) == C && g_um.size(0) == C && loss.numel() == C,
              "group sizes do not match");
  const int64_t I = item_gmf.size(0), P = pair_items.numel();
  TORCH_CHECK(item_gmf.size(1) == m.F && item_mlp.size(1) == m.E && item_mlp.size(0) == I &&
                  row_gmf.size(1) == m.F && row_mlp.size(1) == m.E && g_ug.size(1) == m.F &&
                  g_um.size(1) == m.E && acc_wp.numel() == m.F + m.HL && acc_bp.numel() == 1,
              "table or output widths do not match the model");
  for (int64_t k = 0; k < m.L; ++k)
    TORCH_CHECK(B[k].numel() == m.width[k] && (k == 0 || W[k].size(1) == m.width[k - 1]) &&
                    acc_W[k].sizes() == W[k].sizes() && acc_b[k].sizes() == B[k].sizes(),
                "tower layer ", k, " has inconsistent shapes");
  // every index is checked before any is used: a bad layout is an error, never a stray write
  const int64_t *off = offsets.data_ptr<int64_t>(), *poff = pair_offsets.data_ptr<int64_t>();
  const int64_t *sp = sample_pair.data_ptr<int64_t>(), *pit = pair_items.data_ptr<int64_t>();
  const int64_t* itm = items.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[C] == N && poff[0] == 0 && poff[C] == P,
              "offsets must run from 0 to the number of samples and pairs");
  for (int64_t c = 0; c < C; ++c) {
    TORCH_CHECK(off[c] <= off[c + 1] && poff[c] <= poff[c + 1], "offsets must not decrease");
    for (int64_t i = off[c]; i < off[c + 1]; ++i)
      TORCH_CHECK(sp[i] >= poff[c] && sp[i] < poff[c + 1] && itm[i] >= 0 && itm[i] < I,
                  "sample ", i, " has an item or pair outside its client's range");
  }
  for (int64_t q = 0; q < P; ++q)
    TORCH_CHECK(pit[q] >= 0 && pit[q] < I, "pair ", q, " names an item outside the tables");
  Group g{offsets.data_ptr<int64_t>(), pair_offsets.data_ptr<int64_t>(),
          sample_pair.data_ptr<int64_t>(), pair_items.data_ptr<int64_t>(),
          items.data_ptr<int64_t>(), fp(labels), fp(lweights), fp(client_w), fp(ug), fp(um),
          fp(item_gmf), fp(item_mlp), rho_sh, rho_ns, fp(row_gmf), fp(row_mlp), fp(g_ug),
          fp(g_um), fp(loss)};
  // Clients go in fixed blocks of consecutive clients, the blocks split over torch's threads,
  // each thread with its own workspace; each block's partial sum is kept and the blocks are
  // added in order, so the bytes do not depend on the number of threads.
  constexpr int64_t kBlock = 8;
  const int64_t n_blocks = (C + kBlock - 1) / kBlock;
  struct Partial {
    std::vector<Tensor> W, b;
    Tensor wp;
    double bp = 0.0;
  };
  std::vector<Partial> partials(n_blocks);
  at::parallel_for(0, n_blocks, 1, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kBlock, last = std::min(C, end * kBlock);
    int64_t n_max = 1, p_max = 1;
    for (int64_t c = first; c < last; ++c) {
      n_max = std::max(n_max, g.off[c + 1] - g.off[c]);
      p_max = std::max(p_max, g.poff[c + 1] - g.poff[c]);
    }
    Work w(m, n_max, p_max);
    for (int64_t blk = begin; blk < end; ++blk) {
      for (int64_t k = 0; k < m.L; ++k) {
        w.acc_W[k].zero_();
        w.acc_b[k].zero_();
      }
      w.acc_wp.zero_();
      w.acc_bp = 0.0;
      for (int64_t c = blk * kBlock; c < std::min(C, (blk + 1) * kBlock); ++c) {
        if (g.off[c + 1] > g.off[c]) {
          client(m, g, w, c);
        } else {  // no samples: no loss and no gradient (as the torch code's sums of nothing)
          std::fill_n(g.g_ug + c * m.F, m.F, 0.f);
          std::fill_n(g.g_um + c * m.E, m.E, 0.f);
          g.loss[c] = 0.f;
        }
      }
      Partial& part = partials[blk];
      for (int64_t k = 0; k < m.L; ++k) {
        part.W.push_back(w.acc_W[k].clone());
        part.b.push_back(w.acc_b[k].clone());
      }
      part.wp = w.acc_wp.clone();
      part.bp = w.acc_bp;
    }
  });
  for (const auto& part : partials) {
    for (int64_t k = 0; k < m.L; ++k) {
      acc_W[k].add_(part.W[k]);
      acc_b[k].add_(part.b[k]);
    }
    acc_wp.add_(part.wp);
    fp(acc_bp)[0] += static_cast<float>(part.bp);
  }
}

TORCH_LIBRARY(fedrecgel, m) {
  m.def(
      "ncf_group_step(Tensor offsets, Tensor pair_offsets, Tensor sample_pair, "
      "Tensor pair_items, Tensor items, Tensor labels, Tensor lweights, Tensor client_w, "
      "Tensor ug, Tensor um, Tensor[] W, Tensor[] B, Tensor wp, Tensor bp, Tensor item_gmf, "
      "Tensor item_mlp, float rho_sh, float rho_ns, Tensor(a!)[] acc_W, Tensor(b!)[] acc_b, "
      "Tensor(c!) acc_wp, Tensor(d!) acc_bp, Tensor(e!) row_gmf, Tensor(f!) row_mlp, "
      "Tensor(g!) g_ug, Tensor(h!) g_um, Tensor(i!) loss) -> ()");
  m.impl("ncf_group_step", c10::DispatchKey::CPU, &ncf_group_step);
}
