//! The element codec: the number types the ring reduces, as the little-endian bytes payloads
//! carry.
//!
//! Invariants: a payload is an element slice's memory as it lies (the crate builds for
//! little-endian targets only), so sending needs no copy, and [`elements`] reads back exactly
//! the bits sent: no value is ever converted, rounded or normalised on its way (a NaN keeps its
//! payload). An element's width is its type's size, `size_of::<T>()`.

/// A number type the ring reduces. Payloads carry its little-endian bytes.
pub(crate) trait Element: bytemuck::Pod + Send + Sync {}

impl Element for f32 {}
impl Element for f64 {}
impl Element for i32 {}
impl Element for i64 {}
impl Element for u64 {}
impl Element for i128 {}

/// The elements in `bytes`, a whole number of them, in order.
pub(crate) fn elements<T: Element>(bytes: &[u8]) -> impl Iterator<Item = T> + '_ {
    bytes.chunks_exact(size_of::<T>()).map(bytemuck::pod_read_unaligned)
}

/// An element slice as the payload bytes that carry it.
pub(crate) fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// An element slice as payload bytes to be written.
pub(crate) fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_come_back_with_every_bit() {
        let values = [f64::NAN, -0.0, f64::from_bits(0x7ff4_0000_0000_0001), 1e308, f64::MIN];
        let back: Vec<f64> = elements(as_bytes(&values)).collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
        let ints = [i64::MIN, -1, 0, i64::MAX];
        assert_eq!(elements::<i64>(as_bytes(&ints)).collect::<Vec<_>>(), ints);
        assert_eq!(as_bytes(&[1i64])[0], 1, "little-endian");
        let halves = [f32::from_bits(0x7fa0_0001), -0.0, f32::MAX];
        let back: Vec<u32> = elements::<f32>(as_bytes(&halves)).map(f32::to_bits).collect();
        assert_eq!(back, halves.map(f32::to_bits));
        assert_eq!(
            elements::<i32>(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).collect::<Vec<_>>(),
            [1, -1]
        );
        // Read from any offset: a payload in a receive buffer need not be aligned.
        let bytes = [0u8, 1, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(elements::<u64>(&bytes[1..]).collect::<Vec<_>>(), [1]);
        // An i128 is 16 bytes, low word first; read from an offset its alignment would refuse.
        let wide = [i128::MIN, -1, 1 << 100, i128::MAX];
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(as_bytes(&wide));
        assert_eq!(elements::<i128>(&shifted[1..]).collect::<Vec<_>>(), wide);
        assert_eq!(as_bytes(&[1i128 << 64])[8], 1, "the high word second");
    }
}
