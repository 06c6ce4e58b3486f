// SnakeBeta as one OpenVINO operation: y = x + inv_beta[c] * sin^2(alpha[c] * x), per channel c.
//
// Exported, SnakeBeta is five element-wise nodes (Multiply, Sin, Multiply, Multiply, Add), and
// OpenVINO's CPU plugin runs Sin with a scalar reference kernel: on a 2-core AMD EPYC Zen 4 it
// was ~10% of every decode call. This operation makes one vectorized pass instead (the sine by
// range reduction and a polynomial, accurate to a few units in the last place), threaded over
// the channel rows with the TBB arena OpenVINO runs the inference in.
//
// Built by codecstream.client.runtimes.openvino_extension against the installed OpenVINO and
// put in the graph by codecstream.client.runtimes.openvino_fusion.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <openvino/core/extension.hpp>
#include <openvino/core/op_extension.hpp>
#include <openvino/op/op.hpp>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace codecstream {

// One binary for every x86-64 CPU: the loop below is compiled for AVX-512, AVX2 and the
// baseline, and the loader picks the widest the CPU has.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CODECSTREAM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CODECSTREAM_CLONES
#endif

// Beyond this |alpha * x| the three-part reduction by pi/2 below loses bits; such rows are
// finished with std::sin (never seen in a decode, but the result must stay right).
constexpr float kReducedRange = 8192.0f;

// `odd ? a : b` as a bit mask: GCC vectorizes this where it leaves a ternary as a branch.
static inline float select_odd(std::int32_t quadrant, float odd, float even) {
    const std::int32_t mask = -(quadrant & 1);
    std::int32_t odd_bits, even_bits;
    std::memcpy(&odd_bits, &odd, sizeof odd_bits);
    std::memcpy(&even_bits, &even, sizeof even_bits);
    const std::int32_t bits = (odd_bits & mask) | (even_bits & ~mask);
    float result;
    std::memcpy(&result, &bits, sizeof result);
    return result;
}

// One row of one channel; returns whether any |alpha * x| was outside the reduced range (or
// not a number), in which case the caller computes the row again with std::sin.
CODECSTREAM_CLONES
static bool snake_row(const float* x, float* y, std::size_t length, float alpha, float inv_beta) {
    // pi/2 in three parts with few mantissa bits each, so that j * part is exact (Cody-Waite).
    constexpr float kTwoOverPi = 0.636619772367581343f;
    constexpr float kHalfPi1 = 1.5703125f;
    constexpr float kHalfPi2 = 4.837512969970703125e-4f;
    constexpr float kHalfPi3 = 7.54978995489188216e-8f;
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
    int out_of_range = 0;
    for (std::size_t i = 0; i < length; ++i) {
        const float v = x[i];
        const float a = v * alpha;
        const float quadrant = (a * kTwoOverPi + kRound) - kRound;
        const float r = ((a - quadrant * kHalfPi1) - quadrant * kHalfPi2) - quadrant * kHalfPi3;
        const float r2 = r * r;
        // sin and cos on [-pi/4, pi/4] (minimax coefficients, as in Cephes' sinf and cosf).
        const float sine = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
        const float cosine = 1.0f - 0.5f * r2 +
                             r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
        // sin^2(a) is sin^2(r) in even quadrants and cos^2(r) in odd ones: the sign never matters.
        const float square = select_odd(static_cast<std::int32_t>(quadrant), cosine * cosine, sine * sine);
        y[i] = v + inv_beta * square;
        out_of_range |= static_cast<int>(std::fabs(a) > kReducedRange) | static_cast<int>(a != a);
    }
    return out_of_range != 0;
}

static void snake_row_exact(const float* x, float* y, std::size_t length, float alpha, float inv_beta) {
    for (std::size_t i = 0; i < length; ++i) {
        const float s = std::sin(x[i] * alpha);
        y[i] = x[i] + inv_beta * (s * s);
    }
}

class SnakeBeta : public ov::op::Op {
public:
    OPENVINO_OP("SnakeBeta", "codecstream");

    SnakeBeta() = default;
    // x (batch, channels, time) f32; alpha and inv_beta hold one f32 per channel.
    SnakeBeta(const ov::Output<ov::Node>& x, const ov::Output<ov::Node>& alpha, const ov::Output<ov::Node>& inv_beta)
        : Op({x, alpha, inv_beta}) {
        constructor_validate_and_infer_types();
    }

    void validate_and_infer_types() override {
        const auto& shape = get_input_partial_shape(0);
        NODE_VALIDATION_CHECK(this, get_input_element_type(0) == ov::element::f32, "SnakeBeta: x must be f32");
        NODE_VALIDATION_CHECK(this, shape.rank().compatible(3), "SnakeBeta: x must be (batch, channels, time)");
        set_output_type(0, ov::element::f32, shape);
    }

    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& inputs) const override {
        check_new_args_count(this, inputs);
        return std::make_shared<SnakeBeta>(inputs.at(0), inputs.at(1), inputs.at(2));
    }

    bool visit_attributes(ov::AttributeVisitor&) override {
        return true;
    }

    bool has_evaluate() const override {
        return true;
    }

    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override {
        const ov::Shape shape = inputs[0].get_shape();
        outputs[0].set_shape(shape);
        const std::size_t channels = shape[1], length = shape[2], rows = shape[0] * channels;
        if (inputs[1].get_size() != channels || inputs[2].get_size() != channels) {
            return false;
        }
        const float* x = inputs[0].data<const float>();
        const float* alpha = inputs[1].data<const float>();
        const float* inv_beta = inputs[2].data<const float>();
        float* y = outputs[0].data<float>();
        const bool in_place = x == y;  // the out-of-range fallback must still read the input
        // Rows of at least ~4096 elements a task: short rows (the 2 kHz block at one frame has 4
        // samples a row) would otherwise cost more in scheduling than in arithmetic.
        const std::size_t grain = std::max<std::size_t>(1, 4096 / std::max<std::size_t>(length, 1));
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows, grain), [&](const tbb::blocked_range<std::size_t>& range) {
            for (std::size_t row = range.begin(); row < range.end(); ++row) {
                const std::size_t c = row % channels, offset = row * length;
                std::vector<float> saved;
                if (in_place) {
                    saved.assign(x + offset, x + offset + length);
                }
                if (snake_row(x + offset, y + offset, length, alpha[c], inv_beta[c])) {
                    snake_row_exact(in_place ? saved.data() : x + offset, y + offset, length, alpha[c], inv_beta[c]);
                }
            }
        });
        return true;
    }
};

}  // namespace codecstream

OPENVINO_CREATE_EXTENSIONS(std::vector<ov::Extension::Ptr>({std::make_shared<ov::OpExtension<codecstream::SnakeBeta>>()}));
