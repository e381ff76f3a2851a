//! Realistic command streams for UniCache, generated (no real data set is installable here):
//! email headers as CSV (like the Enron data the UniCache paper used), news-article metadata as
//! CSV (like its New York Times set, with a wider vocabulary) and bus-tracker SQL statements (a
//! few dozen templates with skewed parameters). Words come from /usr/share/dict/words (Debian's
//! wamerican); popularity is Zipf-distributed throughout.

use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use chorus_unicache::{CsvPreprocessor, Preprocessor, SqlParams, SqlPreprocessor, SqlRule};

use crate::generator::Zipfian;
use crate::rng::Rng;

const DICTIONARY: &str = "/usr/share/dict/words";

/// Dictionary words, split into lower-case words and capitalised names (no possessives).
pub struct Dictionary {
    words: Vec<String>,
    names: Vec<String>,
}

impl Dictionary {
    pub fn load() -> anyhow::Result<Dictionary> {
        let text = std::fs::read_to_string(DICTIONARY).with_context(|| {
            format!("cannot read {DICTIONARY}: install Debian's wamerican (scripts/install-bench-tools)")
        })?;
        let mut words = Vec::new();
        let mut names = Vec::new();
        for w in text
            .lines()
            .filter(|w| !w.contains('\'') && w.is_ascii() && w.len() > 1)
        {
            if w.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                names.push(w.to_string());
            } else {
                words.push(w.to_string());
            }
        }
        if words.len() < 50_000 || names.len() < 10_000 {
            bail!("{DICTIONARY} has too few words for the generators");
        }
        // A fixed shuffle, so popular words are not all from the start of the alphabet.
        let mut rng = Rng::new(0xD1C7);
        for list in [&mut words, &mut names] {
            for i in (1..list.len()).rev() {
                list.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        Ok(Dictionary { words, names })
    }
}

/// Zipf-popular picks from a list of the first `size` items.
struct Popular {
    zipf: Zipfian,
    size: u64,
}

impl Popular {
    fn new(size: usize, theta: f64) -> Popular {
        Popular {
            zipf: Zipfian::new(size as u64, theta),
            size: size as u64,
        }
    }

    fn pick(&mut self, rng: &mut Rng) -> usize {
        self.zipf.sample(rng, self.size) as usize
    }
}

/// A stream: records to replicate and the preprocessor configured for them.
pub struct Stream {
    pub name: &'static str,
    pub preprocessor: Arc<dyn Preprocessor>,
    pub records: Vec<Bytes>,
}

fn quote(field: &str) -> String {
    format!("\"{}\"", field.replace('"', "\"\""))
}

/// Enron-like headers: Message-ID, Date, From, To, Subject, X-From, X-To, X-Folder, X-Origin,
/// X-FileName. As in real mail, people write to their usual correspondents (each sender has a
/// few recipient groups) and subjects recur along threads ("Re:", "Fw:").
pub fn email(dict: &Dictionary, count: usize, seed: u64) -> Stream {
    let mut rng = Rng::new(seed);
    let people: Vec<(String, String)> = (0..5_000)
        .map(|i| (dict.names[i * 2].clone(), dict.names[i * 2 + 1].clone()))
        .collect();
    let mut senders = Popular::new(2_000, 0.9);
    let mut groups = Popular::new(12, 0.9);
    let mut owners = Popular::new(150, 0.8);
    let mut folders = Popular::new(40, 1.0 - 1e-9);
    let mut threads = Popular::new(20_000, 0.9);
    let mut subject_words = Popular::new(5_000, 0.9);
    let thread_subjects: Vec<String> = (0..20_000)
        .map(|_| {
            (0..1 + rng.below(6))
                .map(|_| dict.words[subject_words.pick(&mut rng)].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    // Recipient group `g` of sender `s`: 1 to 3 people, the same every time.
    let group = |s: usize, g: usize| -> Vec<usize> {
        let mut r = Rng::new((s as u64) << 8 | g as u64);
        (0..1 + r.below(3)).map(|_| r.below(5_000) as usize).collect()
    };
    let folder_names: Vec<&str> = [
        "inbox",
        "sent_items",
        "deleted_items",
        "all_documents",
        "discussion_threads",
        "notes_inbox",
        "sent",
        "calendar",
        "meetings",
        "contracts",
    ]
    .into_iter()
    .chain(dict.words[..30].iter().map(String::as_str))
    .collect();
    let email_of = |p: &(String, String)| format!("{}.{}@enron.com", p.0.to_lowercase(), p.1.to_lowercase());
    let display = |p: &(String, String)| format!("{}, {}", p.1, p.0);
    let mut records = Vec::with_capacity(count);
    let mut minute = 0u64;
    for n in 0..count {
        minute += 1 + rng.below(30);
        let sender_index = senders.pick(&mut rng);
        let sender = &people[sender_index];
        let to: Vec<&(String, String)> = group(sender_index, groups.pick(&mut rng))
            .into_iter()
            .map(|p| &people[p])
            .collect();
        let owner = &people[owners.pick(&mut rng)];
        let prefix = match rng.below(10) {
            0..=2 => "Re: ",
            3 => "Fw: ",
            _ => "",
        };
        let subject = &thread_subjects[threads.pick(&mut rng)];
        let record = [
            format!(
                "<{}.{}.JavaMail.evans@thyme>",
                10_000_000 + n * 37 + rng.below(37) as usize,
                1_075_840_000 + n
            ),
            quote(&format!(
                "{}, {} {} 2001 {:02}:{:02}:00 -0700 (PDT)",
                ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][(minute / 1440 % 7) as usize],
                minute / 1440 % 28 + 1,
                ["Jan", "Feb", "Mar", "Apr", "May", "Jun"][(minute / 40_320 % 6) as usize],
                minute / 60 % 24,
                minute % 60
            )),
            email_of(sender),
            quote(&to.iter().map(|p| email_of(p)).collect::<Vec<_>>().join(", ")),
            quote(&format!("{prefix}{subject}")),
            quote(&display(sender)),
            quote(&to.iter().map(|p| display(p)).collect::<Vec<_>>().join("; ")),
            quote(&format!(
                "\\{}_{}_Jun2001\\Notes Folders\\{}",
                owner.0,
                owner.1,
                folder_names[folders.pick(&mut rng)]
            )),
            format!("{}-{}", owner.1, &owner.0[..1]),
            format!("{}{}.nsf", owner.0.to_lowercase(), owner.1.to_lowercase()),
        ]
        .join(",");
        records.push(Bytes::from(record));
    }
    Stream {
        name: "email headers (CSV)",
        preprocessor: Arc::new(CsvPreprocessor::new(
            b',',
            &[2, 3, 5, 6, 7, 8, 9],
            &[(1, b' '), (4, b' ')],
        )),
        records,
    }
}

/// NYT-like article metadata: headline, abstract, section, subsection, byline, date, word count,
/// keywords, URL. Free text from a wide vocabulary makes it the hardest of the three.
pub fn news(dict: &Dictionary, count: usize, seed: u64) -> Stream {
    let mut rng = Rng::new(seed);
    let mut text_words = Popular::new(30_000, 0.7);
    let mut sections = Popular::new(25, 0.9);
    let mut subsections = Popular::new(80, 0.9);
    let mut authors = Popular::new(3_000, 0.8);
    let mut keywords = Popular::new(8_000, 0.8);
    let mut records = Vec::with_capacity(count);
    for n in 0..count {
        let mut sentence = |len: u64, rng: &mut Rng| -> Vec<String> {
            (0..len).map(|_| dict.words[text_words.pick(rng)].clone()).collect()
        };
        let headline = sentence(6 + rng.below(7), &mut rng);
        let summary = sentence(15 + rng.below(16), &mut rng);
        let author = authors.pick(&mut rng);
        let byline = format!("By {} {}", dict.names[author * 2], dict.names[author * 2 + 1]);
        let tags: Vec<String> = (0..3 + rng.below(4))
            .map(|_| {
                let k = keywords.pick(&mut rng);
                format!("{} {}", dict.words[30_000 + k], dict.words[k])
            })
            .collect();
        let section = &dict.names[6_000 + sections.pick(&mut rng)];
        let record = [
            quote(&headline.join(" ")),
            quote(&summary.join(" ")),
            section.clone(),
            dict.words[40_000 + subsections.pick(&mut rng)].clone(),
            quote(&byline),
            format!(
                "2021-{:02}-{:02}T{:02}:{:02}:{:02}+0000",
                n / 9_000 % 12 + 1,
                n / 300 % 28 + 1,
                n / 12 % 24,
                n % 60,
                rng.below(60)
            ),
            (300 + rng.below(2_500)).to_string(),
            quote(&tags.join(";")),
            format!(
                "https://www.nytimes.com/2021/{}/{}.html",
                section.to_lowercase(),
                headline[..3.min(headline.len())].join("-")
            ),
        ]
        .join(",");
        records.push(Bytes::from(record));
    }
    Stream {
        name: "news metadata (CSV)",
        preprocessor: Arc::new(CsvPreprocessor::new(
            b',',
            &[2, 3, 4],
            &[(0, b' '), (1, b' '), (7, b';')],
        )),
        records,
    }
}

/// Bus-tracker statements: 32 templates (8 statements over 4 column variants), chosen with
/// Zipf popularity, with skewed vehicles, routes, stops and trips, unique timestamps and
/// positions. Rules make the ids cacheable and leave timestamps verbatim.
pub fn bus_sql(count: usize, seed: u64) -> Stream {
    let mut rng = Rng::new(seed);
    let mut templates = Popular::new(32, 0.9);
    let mut vehicles = Popular::new(1_500, 0.9);
    let mut routes = Popular::new(120, 0.9);
    let mut stops = Popular::new(4_000, 0.9);
    let mut trips = Popular::new(10_000, 0.8);
    let statuses = [
        "IN_TRANSIT_TO",
        "STOPPED_AT",
        "INCOMING_AT",
        "OUT_OF_SERVICE",
        "DEADHEAD",
    ];
    let agencies = ["SL", "UL", "SJ", "VT"];
    let mut records = Vec::with_capacity(count);
    let mut second = 1_795_400_000u64;
    for _ in 0..count {
        second += rng.below(3);
        let ts = format!(
            "2026-11-{:02} {:02}:{:02}:{:02}",
            second / 86_400 % 28 + 1,
            second / 3600 % 24,
            second / 60 % 60,
            second % 60
        );
        let template = templates.pick(&mut rng);
        let (statement, variant) = (template / 4, template % 4);
        let veh = format!("V{:04}", vehicles.pick(&mut rng));
        let route = format!("{}{}", routes.pick(&mut rng), ["", "X", "N", "B"][variant]);
        let stop = format!("S{:05}", stops.pick(&mut rng));
        let trip = format!("T{}-{:05}", route, trips.pick(&mut rng));
        let agency = agencies[variant];
        let lat = format!("59.{:06}", rng.below(1_000_000));
        let lon = format!("18.{:06}", rng.below(1_000_000));
        let sql = match statement {
            0 => format!(
                "INSERT INTO positions (agency, vehicle_id, route_id, trip_id, lat, lon, speed, bearing, recorded_at) VALUES ('{agency}', '{veh}', '{route}', '{trip}', {lat}, {lon}, {}, {}, '{ts}')",
                rng.below(90),
                rng.below(360)
            ),
            1 => format!(
                "UPDATE vehicles SET status = '{}', next_stop = '{stop}', last_seen = '{ts}' WHERE agency = '{agency}' AND vehicle_id = '{veh}'",
                statuses[rng.below(5) as usize]
            ),
            2 => format!(
                "INSERT INTO arrivals (agency, stop_id, route_id, vehicle_id, delay_s, observed_at) VALUES ('{agency}', '{stop}', '{route}', '{veh}', {}, '{ts}')",
                rng.below(600)
            ),
            3 => format!(
                "UPDATE stops SET crowding = '{}', updated_at = '{ts}' WHERE agency = '{agency}' AND stop_id = '{stop}'",
                ["LOW", "MEDIUM", "HIGH", "FULL"][rng.below(4) as usize]
            ),
            4 => format!("UPDATE trips SET state = 'RUNNING', vehicle_id = '{veh}' WHERE trip_id = '{trip}'"),
            5 => format!(
                "INSERT INTO alerts (agency, route_id, kind, message, expires_at) VALUES ('{agency}', '{route}', '{}', 'Delays on line {route} due to {}', '{ts}')",
                ["DELAY", "DETOUR", "CANCELLATION"][rng.below(3) as usize],
                ["roadworks", "an accident", "weather", "a technical fault"][rng.below(4) as usize]
            ),
            6 => format!("DELETE FROM alerts WHERE agency = '{agency}' AND route_id = '{route}' AND expires_at < '{ts}'"),
            _ => format!(
                "INSERT INTO passenger_counts (agency, vehicle_id, stop_id, boarded, alighted, counted_at) VALUES ('{agency}', '{veh}', '{stop}', {}, {}, '{ts}')",
                rng.below(40),
                rng.below(40)
            ),
        };
        records.push(Bytes::from(sql));
    }
    let rule = |prefix: &str, cacheable: &[usize]| SqlRule {
        template_prefix: prefix.to_string(),
        cacheable: cacheable.to_vec(),
    };
    Stream {
        name: "bus tracker (SQL)",
        preprocessor: Arc::new(SqlPreprocessor {
            rules: vec![
                rule("INSERT INTO positions", &[0, 1, 2, 3]),
                rule("UPDATE vehicles", &[0, 1, 3, 4]),
                rule("INSERT INTO arrivals", &[0, 1, 2, 3]),
                rule("UPDATE stops", &[0, 2, 3]),
                rule("UPDATE trips", &[0, 1, 2]),
                rule("INSERT INTO alerts", &[0, 1, 2, 3]),
                rule("DELETE FROM alerts", &[0, 1]),
                rule("INSERT INTO passenger_counts", &[0, 1, 2]),
            ],
            default: SqlParams::Strings,
        }),
        records,
    }
}
