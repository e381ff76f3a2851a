//! Geospatial indexes as Redis 7 keeps them: a sorted set whose scores are 52-bit geohashes
//! (longitude and latitude interleaved, 26 bits each, latitudes limited to ±85.05112878° as in
//! Web Mercator). Encoding, decoding, the boxes a search looks in, distances and the way replies
//! print them follow Redis's arithmetic step by step, so positions, distances and the members a
//! search finds are Redis's to the last digit.

use std::f64::consts::PI;

pub const LONGITUDE_MIN: f64 = -180.0;
pub const LONGITUDE_MAX: f64 = 180.0;
pub const LATITUDE_MIN: f64 = -85.051_128_78;
pub const LATITUDE_MAX: f64 = 85.051_128_78;
/// Bits per coordinate in a stored score.
const STEP_MAX: u8 = 26;
const EARTH_RADIUS_M: f64 = 6_372_797.560_856;
const MERCATOR_MAX: f64 = 20_037_726.37;
const DEGREE_IN_RADIANS: f64 = PI / 180.0;
const BASE32: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";

#[derive(Debug, Clone, Copy, PartialEq)]
struct Range {
    min: f64,
    max: f64,
}

const WGS84_LONGITUDES: Range = Range {
    min: LONGITUDE_MIN,
    max: LONGITUDE_MAX,
};
const WGS84_LATITUDES: Range = Range {
    min: LATITUDE_MIN,
    max: LATITUDE_MAX,
};

/// A geohash of `step` bits per coordinate (step 0 with no bits: none, as Redis zeroes the
/// neighbours a search leaves out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HashBits {
    bits: u64,
    step: u8,
}

impl HashBits {
    const NONE: HashBits = HashBits { bits: 0, step: 0 };
}

/// The cell a geohash names.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Area {
    longitude: Range,
    latitude: Range,
}

/// Spreads the bits of `x` to the even positions and those of `y` to the odd ones.
fn interleave(x: u32, y: u32) -> u64 {
    fn spread(v: u32) -> u64 {
        let mut v = u64::from(v);
        v = (v | v << 16) & 0x0000_ffff_0000_ffff;
        v = (v | v << 8) & 0x00ff_00ff_00ff_00ff;
        v = (v | v << 4) & 0x0f0f_0f0f_0f0f_0f0f;
        v = (v | v << 2) & 0x3333_3333_3333_3333;
        (v | v << 1) & 0x5555_5555_5555_5555
    }
    spread(x) | spread(y) << 1
}

/// The inverse of `interleave`: the even bits in the low half, the odd ones in the high half.
fn deinterleave(bits: u64) -> u64 {
    fn squash(mut v: u64) -> u64 {
        v &= 0x5555_5555_5555_5555;
        v = (v | v >> 1) & 0x3333_3333_3333_3333;
        v = (v | v >> 2) & 0x0f0f_0f0f_0f0f_0f0f;
        v = (v | v >> 4) & 0x00ff_00ff_00ff_00ff;
        v = (v | v >> 8) & 0x0000_ffff_0000_ffff;
        (v | v >> 16) & 0x0000_0000_ffff_ffff
    }
    squash(bits) | squash(bits >> 1) << 32
}

fn in_wgs84_limits(longitude: f64, latitude: f64) -> bool {
    (LONGITUDE_MIN..=LONGITUDE_MAX).contains(&longitude) && (LATITUDE_MIN..=LATITUDE_MAX).contains(&latitude)
}

fn encode(longitudes: Range, latitudes: Range, longitude: f64, latitude: f64, step: u8) -> Option<HashBits> {
    if !in_wgs84_limits(longitude, latitude)
        || !(longitudes.min..=longitudes.max).contains(&longitude)
        || !(latitudes.min..=latitudes.max).contains(&latitude)
    {
        return None;
    }
    let scale = (1u64 << step) as f64;
    let latitude_offset = (latitude - latitudes.min) / (latitudes.max - latitudes.min) * scale;
    let longitude_offset = (longitude - longitudes.min) / (longitudes.max - longitudes.min) * scale;
    Some(HashBits {
        bits: interleave(latitude_offset as u32, longitude_offset as u32),
        step,
    })
}

fn decode(longitudes: Range, latitudes: Range, hash: HashBits) -> Area {
    let separated = deinterleave(hash.bits);
    let (latitude_cell, longitude_cell) = (separated as u32, (separated >> 32) as u32);
    let cells = (1u64 << hash.step) as f64;
    let edge = |range: Range, cell: u32| range.min + (f64::from(cell) / cells) * (range.max - range.min);
    let next_edge =
        |range: Range, cell: u32| range.min + (f64::from(cell.wrapping_add(1)) / cells) * (range.max - range.min);
    Area {
        longitude: Range {
            min: edge(longitudes, longitude_cell),
            max: next_edge(longitudes, longitude_cell),
        },
        latitude: Range {
            min: edge(latitudes, latitude_cell),
            max: next_edge(latitudes, latitude_cell),
        },
    }
}

/// The score GEOADD stores for a position, or `None` outside the limits.
pub fn score_of(longitude: f64, latitude: f64) -> Option<f64> {
    let hash = encode(WGS84_LONGITUDES, WGS84_LATITUDES, longitude, latitude, STEP_MAX)?;
    Some(aligned(hash) as f64)
}

/// A hash's bits moved to the top of 52, as a stored score holds them.
fn aligned(hash: HashBits) -> u64 {
    hash.bits << (52 - u32::from(hash.step) * 2)
}

/// A score as C's `(uint64_t)` cast gives it on x86-64, where Redis is built: a score no geo
/// command stored (any ZADD's) still decodes to the position Redis decodes it to.
fn score_bits(score: f64) -> u64 {
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    // cvttsd2si: truncation, or 1 << 63 for what does not fit (NaN included).
    let truncate = |x: f64| {
        if (-TWO_TO_63..TWO_TO_63).contains(&x) {
            x as i64 as u64
        } else {
            1 << 63
        }
    };
    if score >= TWO_TO_63 {
        truncate(score - TWO_TO_63) ^ 1 << 63
    } else {
        truncate(score)
    }
}

/// The longitude and latitude a stored score stands for: the centre of its cell.
pub fn position_of(score: f64) -> (f64, f64) {
    let area = decode(
        WGS84_LONGITUDES,
        WGS84_LATITUDES,
        HashBits {
            bits: score_bits(score),
            step: STEP_MAX,
        },
    );
    let longitude = ((area.longitude.min + area.longitude.max) / 2.0).clamp(LONGITUDE_MIN, LONGITUDE_MAX);
    let latitude = ((area.latitude.min + area.latitude.max) / 2.0).clamp(LATITUDE_MIN, LATITUDE_MAX);
    (longitude, latitude)
}

/// GEOHASH's string for a stored score: the standard geohash (latitudes from -90 to 90) of its
/// position, 11 characters, the last always `0`.
pub fn geohash_text(score: f64) -> String {
    let (longitude, latitude) = position_of(score);
    let standard = Range { min: -90.0, max: 90.0 };
    let bits = encode(WGS84_LONGITUDES, standard, longitude, latitude, STEP_MAX).map_or(0, |h| h.bits);
    (0..11)
        .map(|i| {
            let at = if i == 10 {
                0
            } else {
                (bits >> (52 - (i + 1) * 5)) & 0x1f
            };
            char::from(BASE32[at as usize])
        })
        .collect()
}

fn radians(degrees: f64) -> f64 {
    degrees * DEGREE_IN_RADIANS
}

fn degrees(radians: f64) -> f64 {
    radians / DEGREE_IN_RADIANS
}

fn latitude_distance(latitude_a: f64, latitude_b: f64) -> f64 {
    EARTH_RADIUS_M * (radians(latitude_b) - radians(latitude_a)).abs()
}

/// The great-circle distance in metres (haversine, on Redis's sphere).
pub fn distance(longitude_a: f64, latitude_a: f64, longitude_b: f64, latitude_b: f64) -> f64 {
    let v = ((radians(longitude_b) - radians(longitude_a)) / 2.0).sin();
    if v == 0.0 {
        return latitude_distance(latitude_a, latitude_b);
    }
    let (latitude_a, latitude_b) = (radians(latitude_a), radians(latitude_b));
    let u = ((latitude_b - latitude_a) / 2.0).sin();
    let a = u * u + latitude_a.cos() * latitude_b.cos() * v * v;
    2.0 * EARTH_RADIUS_M * a.sqrt().asin()
}

/// What a search covers around its centre.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Extent {
    Radius(f64),
    Box { width: f64, height: f64 },
}

/// A search's centre and extent, in the unit `metres_per_unit` converts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub longitude: f64,
    pub latitude: f64,
    pub extent: Extent,
    pub metres_per_unit: f64,
}

impl Shape {
    /// Where a stored score lies and how far from the centre, if within the shape.
    pub fn locate(&self, score: f64) -> Option<(f64, f64, f64)> {
        let (longitude, latitude) = position_of(score);
        let distance_m = match self.extent {
            Extent::Radius(radius) => {
                let d = distance(self.longitude, self.latitude, longitude, latitude);
                (d <= radius * self.metres_per_unit).then_some(d)?
            }
            Extent::Box { width, height } => {
                if latitude_distance(latitude, self.latitude) > height * self.metres_per_unit / 2.0 {
                    return None;
                }
                if distance(longitude, latitude, self.longitude, latitude) > width * self.metres_per_unit / 2.0 {
                    return None;
                }
                distance(self.longitude, self.latitude, longitude, latitude)
            }
        };
        Some((longitude, latitude, distance_m))
    }

    /// The score ranges, `[min, max)`, a search reads in turn: the centre's cell and those of its
    /// eight neighbours that can hold a match, at a cell size fitted to the extent.
    pub fn score_ranges(&self) -> Vec<(f64, f64)> {
        let (half_height, half_width) = match self.extent {
            Extent::Radius(radius) => (radius, radius),
            Extent::Box { width, height } => (height / 2.0, width / 2.0),
        };
        let (half_height, half_width) = (self.metres_per_unit * half_height, self.metres_per_unit * half_width);
        let latitude_delta = degrees(half_height / EARTH_RADIUS_M);
        let longitude_delta_top = degrees(half_width / EARTH_RADIUS_M / radians(self.latitude + latitude_delta).cos());
        let longitude_delta_bottom =
            degrees(half_width / EARTH_RADIUS_M / radians(self.latitude - latitude_delta).cos());
        let longitude_delta = if self.latitude < 0.0 {
            longitude_delta_bottom
        } else {
            longitude_delta_top
        };
        let bounds = Area {
            longitude: Range {
                min: self.longitude - longitude_delta,
                max: self.longitude + longitude_delta,
            },
            latitude: Range {
                min: self.latitude - latitude_delta,
                max: self.latitude + latitude_delta,
            },
        };
        let radius_m = match self.extent {
            Extent::Radius(radius) => radius,
            Extent::Box { width, height } => ((width / 2.0) * (width / 2.0) + (height / 2.0) * (height / 2.0)).sqrt(),
        } * self.metres_per_unit;
        let mut step = estimate_step(radius_m, self.latitude);
        let cell = |step| {
            let hash = encode(WGS84_LONGITUDES, WGS84_LATITUDES, self.longitude, self.latitude, step)
                .expect("a search's centre lies within the limits");
            (hash, neighbours(hash))
        };
        let (mut hash, mut around) = cell(step);
        let area_of = |h| decode(WGS84_LONGITUDES, WGS84_LATITUDES, h);
        // Cells too small to reach the bounds from the centre's: one step larger.
        let too_small = area_of(around[NORTH]).latitude.max < bounds.latitude.max
            || area_of(around[SOUTH]).latitude.min > bounds.latitude.min
            || area_of(around[EAST]).longitude.max < bounds.longitude.max
            || area_of(around[WEST]).longitude.min > bounds.longitude.min;
        if step > 1 && too_small {
            step -= 1;
            (hash, around) = cell(step);
        }
        let area = area_of(hash);
        if step >= 2 {
            let mut drop = |sides: [usize; 3]| sides.into_iter().for_each(|side| around[side] = HashBits::NONE);
            if area.latitude.min < bounds.latitude.min {
                drop([SOUTH, SOUTH_WEST, SOUTH_EAST]);
            }
            if area.latitude.max > bounds.latitude.max {
                drop([NORTH, NORTH_EAST, NORTH_WEST]);
            }
            if area.longitude.min < bounds.longitude.min {
                drop([WEST, SOUTH_WEST, NORTH_WEST]);
            }
            if area.longitude.max > bounds.longitude.max {
                drop([EAST, SOUTH_EAST, NORTH_EAST]);
            }
        }
        let cells = [
            hash,
            around[NORTH],
            around[SOUTH],
            around[EAST],
            around[WEST],
            around[NORTH_EAST],
            around[NORTH_WEST],
            around[SOUTH_EAST],
            around[SOUTH_WEST],
        ];
        // Very large extents make neighbours coincide: a cell equal to the one read just before
        // (the centre's aside, as in Redis) is read once.
        let mut last_read: Option<HashBits> = None;
        let mut ranges = Vec::with_capacity(9);
        for (i, cell) in cells.into_iter().enumerate() {
            if cell == HashBits::NONE || (i > 0 && last_read == Some(cell)) {
                continue;
            }
            let next = HashBits {
                bits: cell.bits + 1,
                step: cell.step,
            };
            ranges.push((aligned(cell) as f64, aligned(next) as f64));
            if i > 0 {
                last_read = Some(cell);
            }
        }
        ranges
    }
}

const NORTH: usize = 0;
const SOUTH: usize = 1;
const EAST: usize = 2;
const WEST: usize = 3;
const NORTH_EAST: usize = 4;
const NORTH_WEST: usize = 5;
const SOUTH_EAST: usize = 6;
const SOUTH_WEST: usize = 7;

/// The cell size (bits per coordinate) a search of `radius_m` at `latitude` starts from.
fn estimate_step(mut radius_m: f64, latitude: f64) -> u8 {
    if radius_m == 0.0 {
        return STEP_MAX;
    }
    let mut step: i32 = 1;
    while radius_m < MERCATOR_MAX {
        radius_m *= 2.0;
        step += 1;
    }
    step -= 2;
    if !(-66.0..=66.0).contains(&latitude) {
        step -= 1;
        if !(-80.0..=80.0).contains(&latitude) {
            step -= 1;
        }
    }
    step.clamp(1, i32::from(STEP_MAX)) as u8
}

/// The eight cells around `hash`, indexed by `NORTH` .. `SOUTH_WEST` (wrapping at the edges).
fn neighbours(hash: HashBits) -> [HashBits; 8] {
    let moved = |dx: i8, dy: i8| {
        let mut h = hash;
        move_along(&mut h, dx, 0xaaaa_aaaa_aaaa_aaaa);
        move_along(&mut h, dy, 0x5555_5555_5555_5555);
        h
    };
    let mut around = [HashBits::NONE; 8];
    around[EAST] = moved(1, 0);
    around[WEST] = moved(-1, 0);
    around[SOUTH] = moved(0, -1);
    around[NORTH] = moved(0, 1);
    around[NORTH_WEST] = moved(-1, 1);
    around[NORTH_EAST] = moved(1, 1);
    around[SOUTH_EAST] = moved(1, -1);
    around[SOUTH_WEST] = moved(-1, -1);
    around
}

/// Moves a hash one cell along the coordinate whose bits `mask` selects (odd bits: longitude).
fn move_along(hash: &mut HashBits, direction: i8, mask: u64) {
    if direction == 0 {
        return;
    }
    let shift = 64 - u32::from(hash.step) * 2;
    let other_mask = !mask;
    let mut moving = hash.bits & mask;
    let kept = hash.bits & other_mask;
    let filler = other_mask >> shift;
    if direction > 0 {
        moving = moving.wrapping_add(filler + 1);
    } else {
        moving |= filler;
        moving = moving.wrapping_sub(filler + 1);
    }
    moving &= mask >> shift;
    hash.bits = moving | kept;
}

/// A distance as Redis prints one: rounded to 4 decimals (ties to even), always 4 shown.
pub fn distance_text(distance: f64) -> String {
    let scaled = (distance * 10_000.0).round_ties_even() as i64;
    let sign = if scaled < 0 { "-" } else { "" };
    let scaled = scaled.unsigned_abs();
    format!("{sign}{}.{:04}", scaled / 10_000, scaled % 10_000)
}

#[cfg(test)]
mod tests {
    use chorus_resp::format_human_double;

    use super::*;

    #[test]
    fn positions_hashes_and_distances_are_redis_s() {
        // From redis-server 7.0.15: GEOADD Sicily 13.361389 38.115556 Palermo 15.087269
        // 37.502669 Catania, then ZSCORE, GEOPOS, GEOHASH and GEODIST.
        let palermo = score_of(13.361389, 38.115556).unwrap();
        let catania = score_of(15.087269, 37.502669).unwrap();
        assert_eq!((palermo, catania), (3_479_099_956_230_698.0, 3_479_447_370_796_909.0));
        let (longitude, latitude) = position_of(palermo);
        assert_eq!(
            (format_human_double(longitude), format_human_double(latitude)),
            ("13.36138933897018433".to_string(), "38.11555639549629859".to_string())
        );
        assert_eq!(geohash_text(palermo), "sqc8b49rny0");
        assert_eq!(geohash_text(catania), "sqdtr74hyu0");
        let (a, b) = (position_of(palermo), position_of(catania));
        assert_eq!(distance_text(distance(a.0, a.1, b.0, b.1)), "166274.1516");
        assert_eq!(distance_text(distance(a.0, a.1, b.0, b.1) / 1000.0), "166.2742");
    }

    #[test]
    fn out_of_limits_positions_have_no_score() {
        assert_eq!(score_of(180.1, 0.0), None);
        assert_eq!(score_of(0.0, 85.06), None);
        assert!(score_of(-180.0, -85.051_128_78).is_some());
    }

    #[test]
    fn interleaving_round_trips() {
        for (x, y) in [(0, 0), (1, 2), (u32::MAX, 0), (0x1234_5678, 0x9abc_def0)] {
            let separated = deinterleave(interleave(x, y));
            assert_eq!((separated as u32, (separated >> 32) as u32), (x, y));
        }
    }

    #[test]
    fn scores_no_geo_command_stored_decode_as_redis_casts_them() {
        assert_eq!(score_bits(-1.0), u64::MAX);
        assert_eq!(score_bits(f64::INFINITY), 0);
        assert_eq!(score_bits(f64::NEG_INFINITY), 1 << 63);
        assert_eq!(score_bits(2.5), 2);
        assert_eq!(score_bits(1e19), 10_000_000_000_000_000_000);
    }

    #[test]
    fn distances_and_coordinates_print_as_redis_prints_them() {
        assert_eq!(distance_text(0.0), "0.0000");
        assert_eq!(distance_text(0.00004), "0.0000");
        assert_eq!(distance_text(12.34565), "12.3456");
        assert_eq!(format_human_double(13.5), "13.5");
        assert_eq!(format_human_double(-0.0), "0");
        assert_eq!(format_human_double(180.0), "180");
    }
}
