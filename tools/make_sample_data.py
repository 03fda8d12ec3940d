"""Make the parallel data for the sample model: template sentences in five languages.

Every sentence is a tuple of slot values (template, subject, verb, tense, number, object, colour,
place, time, ...) rendered in English, French, German, Spanish and Italian by hand-written grammar
(agreement of articles, adjectives and participles, German verb-second and verb-final order,
capitalisation of days and months per language), so every sentence exists in all five languages
and every direction can be trained and tested. Numbers, dates and clock times are written out in
words with num2words (which the GPU image lacks: make the data here and carry it there).

A held-out set of tuples is drawn first: training never sees any of those tuples, nor the numbers
reserved for them. The script checks that no two different tuples render to the same sentence in
any language (so that every source sentence has one right translation) and writes

    OUT/train.tsv        one tuple per line: eng fra deu spa ita, tab-separated
    OUT/heldout.tsv      the held-out tuples, same columns
    data/samples/heldout/<lang>.txt   the first HELDOUT_SHIPPED held-out tuples, one sentence a line

Usage: python tools/make_sample_data.py [--out .scratch/data] [--train 200000] [--seed 1234]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from num2words import num2words

LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]
L = ["en", "fr", "de", "es", "it"]  # short keys used in the lexicon, same order as LANGS
N2W = {"en": "en", "fr": "fr", "de": "de", "es": "es", "it": "it"}
HELDOUT_TUPLES = 500
HELDOUT_SHIPPED = 100
REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# Lexicon
# ---------------------------------------------------------------------------------------------

# Names are the same in every language; none ends in s, x or z (German genitive "Annas").
NAMES = [("Anna", "f"), ("Laura", "f"), ("Clara", "f"), ("Elena", "f"), ("Julia", "f"), ("Emma", "f"),
         ("Nina", "f"), ("Lena", "f"), ("Sara", "f"), ("Paula", "f"),
         ("David", "m"), ("Daniel", "m"), ("Marco", "m"), ("Hugo", "m"), ("Oscar", "m"), ("Leo", "m"),
         ("Paul", "m"), ("Peter", "m"), ("Tom", "m"), ("Simon", "m")]

# Family members: en, fr, de, es, it, gender. Used with "my" / "our" as subjects (nominative).
FAMILY = [
    ("brother", "frère", "Bruder", "hermano", "fratello", "m"),
    ("sister", "sœur", "Schwester", "hermana", "sorella", "f"),
    ("father", "père", "Vater", "padre", "padre", "m"),
    ("mother", "mère", "Mutter", "madre", "madre", "f"),
    ("uncle", "oncle", "Onkel", "tío", "zio", "m"),
    ("aunt", "tante", "Tante", "tía", "zia", "f"),
    ("grandfather", "grand-père", "Großvater", "abuelo", "nonno", "m"),
    ("grandmother", "grand-mère", "Großmutter", "abuela", "nonna", "f"),
    ("son", "fils", "Sohn", "hijo", "figlio", "m"),
    ("daughter", "fille", "Tochter", "hija", "figlia", "f"),
]
POSSESSIVE = {  # (masculine, feminine) nominative singular; Italian kinship nouns take no article
    "my": {"en": ("my", "my"), "fr": ("mon", "ma"), "de": ("mein", "meine"), "es": ("mi", "mi"), "it": ("mio", "mia")},
    "our": {"en": ("our", "our"), "fr": ("notre", "notre"), "de": ("unser", "unsere"), "es": ("nuestro", "nuestra"),
            "it": ("nostro", "nostra")},
}
# Pronoun subjects; Spanish and Italian drop them (the verb ending carries the person).
PRONOUNS = {
    "1sg": {"en": "I", "fr": "je", "de": "ich", "es": "", "it": ""},
    "1pl": {"en": "we", "fr": "nous", "de": "wir", "es": "", "it": ""},
    "3pl": {"en": "they", "fr": "ils", "de": "sie", "es": "", "it": ""},
}
PERSONS = ["1sg", "3sg", "1pl", "3pl"]

# Objects: en (sg, pl); fr (gender, sg, pl); de (gender, sg, pl); es (gender, sg, pl); it (gender, article+sg, pl).
OBJECTS = [
    (("book", "books"), ("m", "livre", "livres"), ("n", "Buch", "Bücher"), ("m", "libro", "libros"), ("m", "il libro", "libri")),
    (("car", "cars"), ("f", "voiture", "voitures"), ("n", "Auto", "Autos"), ("m", "coche", "coches"), ("f", "la macchina", "macchine")),
    (("table", "tables"), ("f", "table", "tables"), ("m", "Tisch", "Tische"), ("f", "mesa", "mesas"), ("m", "il tavolo", "tavoli")),
    (("chair", "chairs"), ("f", "chaise", "chaises"), ("m", "Stuhl", "Stühle"), ("f", "silla", "sillas"), ("f", "la sedia", "sedie")),
    (("flower", "flowers"), ("f", "fleur", "fleurs"), ("f", "Blume", "Blumen"), ("f", "flor", "flores"), ("m", "il fiore", "fiori")),
    (("cup", "cups"), ("f", "tasse", "tasses"), ("f", "Tasse", "Tassen"), ("f", "taza", "tazas"), ("f", "la tazza", "tazze")),
    (("bag", "bags"), ("m", "sac", "sacs"), ("f", "Tasche", "Taschen"), ("m", "bolso", "bolsos"), ("f", "la borsa", "borse")),
    (("shirt", "shirts"), ("f", "chemise", "chemises"), ("n", "Hemd", "Hemden"), ("f", "camisa", "camisas"), ("f", "la camicia", "camicie")),
    (("hat", "hats"), ("m", "chapeau", "chapeaux"), ("m", "Hut", "Hüte"), ("m", "sombrero", "sombreros"), ("m", "il cappello", "cappelli")),
    (("bicycle", "bicycles"), ("m", "vélo", "vélos"), ("n", "Fahrrad", "Fahrräder"), ("f", "bicicleta", "bicicletas"), ("f", "la bicicletta", "biciclette")),
    (("ball", "balls"), ("m", "ballon", "ballons"), ("m", "Ball", "Bälle"), ("f", "pelota", "pelotas"), ("f", "la palla", "palle")),
    (("key", "keys"), ("f", "clé", "clés"), ("m", "Schlüssel", "Schlüssel"), ("f", "llave", "llaves"), ("f", "la chiave", "chiavi")),
    (("box", "boxes"), ("f", "boîte", "boîtes"), ("f", "Kiste", "Kisten"), ("f", "caja", "cajas"), ("f", "la scatola", "scatole")),
    (("pen", "pens"), ("m", "stylo", "stylos"), ("m", "Stift", "Stifte"), ("m", "bolígrafo", "bolígrafos"), ("f", "la penna", "penne")),
    (("umbrella", "umbrellas"), ("m", "parapluie", "parapluies"), ("m", "Regenschirm", "Regenschirme"), ("m", "paraguas", "paraguas"), ("m", "l'ombrello", "ombrelli")),
    (("lamp", "lamps"), ("f", "lampe", "lampes"), ("f", "Lampe", "Lampen"), ("f", "lámpara", "lámparas"), ("f", "la lampada", "lampade")),
    (("coat", "coats"), ("m", "manteau", "manteaux"), ("m", "Mantel", "Mäntel"), ("m", "abrigo", "abrigos"), ("m", "il cappotto", "cappotti")),
    (("shoe", "shoes"), ("f", "chaussure", "chaussures"), ("m", "Schuh", "Schuhe"), ("m", "zapato", "zapatos"), ("f", "la scarpa", "scarpe")),
    (("house", "houses"), ("f", "maison", "maisons"), ("n", "Haus", "Häuser"), ("f", "casa", "casas"), ("f", "la casa", "case")),
    (("bottle", "bottles"), ("f", "bouteille", "bouteilles"), ("f", "Flasche", "Flaschen"), ("f", "botella", "botellas"), ("f", "la bottiglia", "bottiglie")),
]

# Colours: en; fr/es/it (m sg, f sg, m pl, f pl); de stem (takes -e / -en).
COLOURS = [
    ("red", ("rouge", "rouge", "rouges", "rouges"), "rot", ("rojo", "roja", "rojos", "rojas"), ("rosso", "rossa", "rossi", "rosse")),
    ("blue", ("bleu", "bleue", "bleus", "bleues"), "blau", ("azul", "azul", "azules", "azules"), ("blu", "blu", "blu", "blu")),
    ("green", ("vert", "verte", "verts", "vertes"), "grün", ("verde", "verde", "verdes", "verdes"), ("verde", "verde", "verdi", "verdi")),
    ("black", ("noir", "noire", "noirs", "noires"), "schwarz", ("negro", "negra", "negros", "negras"), ("nero", "nera", "neri", "nere")),
    ("white", ("blanc", "blanche", "blancs", "blanches"), "weiß", ("blanco", "blanca", "blancos", "blancas"), ("bianco", "bianca", "bianchi", "bianche")),
    ("yellow", ("jaune", "jaune", "jaunes", "jaunes"), "gelb", ("amarillo", "amarilla", "amarillos", "amarillas"), ("giallo", "gialla", "gialli", "gialle")),
    ("grey", ("gris", "grise", "gris", "grises"), "grau", ("gris", "gris", "grises", "grises"), ("grigio", "grigia", "grigi", "grigie")),
    ("brown", ("marron", "marron", "marron", "marron"), "braun", ("marrón", "marrón", "marrones", "marrones"), ("marrone", "marrone", "marroni", "marroni")),
]

# Transitive verbs. en: (base, 3sg, past); fr: (present 1sg 3sg 1pl 3pl, participle, future stem);
# de: (present x4, participle); es: (present x4, preterite x4, infinitive = future stem);
# it: (present x4, participle, future stem). All take avoir / haben / avere.
VERBS = [
    dict(en=("buy", "buys", "bought"),
         fr=(("achète", "achète", "achetons", "achètent"), "acheté", "achèter"),
         de=(("kaufe", "kauft", "kaufen", "kaufen"), "gekauft", "kaufen"),
         es=(("compro", "compra", "compramos", "compran"), ("compré", "compró", "compramos", "compraron"), "comprar"),
         it=(("compro", "compra", "compriamo", "comprano"), "comprato", "comprer")),
    dict(en=("sell", "sells", "sold"),
         fr=(("vends", "vend", "vendons", "vendent"), "vendu", "vendr"),
         de=(("verkaufe", "verkauft", "verkaufen", "verkaufen"), "verkauft", "verkaufen"),
         es=(("vendo", "vende", "vendemos", "venden"), ("vendí", "vendió", "vendimos", "vendieron"), "vender"),
         it=(("vendo", "vende", "vendiamo", "vendono"), "venduto", "vender")),
    dict(en=("find", "finds", "found"),
         fr=(("trouve", "trouve", "trouvons", "trouvent"), "trouvé", "trouver"),
         de=(("finde", "findet", "finden", "finden"), "gefunden", "finden"),
         es=(("encuentro", "encuentra", "encontramos", "encuentran"), ("encontré", "encontró", "encontramos", "encontraron"), "encontrar"),
         it=(("trovo", "trova", "troviamo", "trovano"), "trovato", "trover")),
    dict(en=("lose", "loses", "lost"),
         fr=(("perds", "perd", "perdons", "perdent"), "perdu", "perdr"),
         de=(("verliere", "verliert", "verlieren", "verlieren"), "verloren", "verlieren"),
         es=(("pierdo", "pierde", "perdemos", "pierden"), ("perdí", "perdió", "perdimos", "perdieron"), "perder"),
         it=(("perdo", "perde", "perdiamo", "perdono"), "perso", "perder")),
    dict(en=("bring", "brings", "brought"),
         fr=(("apporte", "apporte", "apportons", "apportent"), "apporté", "apporter"),
         de=(("bringe", "bringt", "bringen", "bringen"), "gebracht", "bringen"),
         es=(("traigo", "trae", "traemos", "traen"), ("traje", "trajo", "trajimos", "trajeron"), "traer"),
         it=(("porto", "porta", "portiamo", "portano"), "portato", "porter")),
    dict(en=("see", "sees", "saw"),
         fr=(("vois", "voit", "voyons", "voient"), "vu", "verr"),
         de=(("sehe", "sieht", "sehen", "sehen"), "gesehen", "sehen"),
         es=(("veo", "ve", "vemos", "ven"), ("vi", "vio", "vimos", "vieron"), "ver"),
         it=(("vedo", "vede", "vediamo", "vedono"), "visto", "vedr")),
]
AUX_HAVE = {"fr": ("ai", "a", "avons", "ont"), "de": ("habe", "hat", "haben", "haben"), "it": ("ho", "ha", "abbiamo", "hanno")}
AUX_BE = {"fr": ("suis", "est", "sommes", "sont"), "de": ("bin", "ist", "sind", "sind"), "it": ("sono", "è", "siamo", "sono")}
WERDEN = ("werde", "wird", "werden", "werden")
FUT_END = {"fr": ("ai", "a", "ons", "ont"), "es": ("é", "á", "emos", "án"), "it": ("ò", "à", "emo", "anno")}

PLACES = [  # where something happens (German dative)
    ("at the market", "au marché", "auf dem Markt", "en el mercado", "al mercato"),
    ("at the station", "à la gare", "am Bahnhof", "en la estación", "alla stazione"),
    ("in the shop", "dans le magasin", "im Geschäft", "en la tienda", "nel negozio"),
    ("in the garden", "dans le jardin", "im Garten", "en el jardín", "nel giardino"),
    ("in the park", "dans le parc", "im Park", "en el parque", "nel parco"),
    ("at school", "à l'école", "in der Schule", "en la escuela", "a scuola"),
    ("in the kitchen", "dans la cuisine", "in der Küche", "en la cocina", "in cucina"),
    ("at the airport", "à l'aéroport", "am Flughafen", "en el aeropuerto", "all'aeroporto"),
    ("at the office", "au bureau", "im Büro", "en la oficina", "in ufficio"),
    ("at the library", "à la bibliothèque", "in der Bibliothek", "en la biblioteca", "in biblioteca"),
    ("on the beach", "sur la plage", "am Strand", "en la playa", "in spiaggia"),
]

CITIES = [  # en, fr, de, es, it
    ("Paris", "Paris", "Paris", "París", "Parigi"), ("London", "Londres", "London", "Londres", "Londra"),
    ("Rome", "Rome", "Rom", "Roma", "Roma"), ("Berlin", "Berlin", "Berlin", "Berlín", "Berlino"),
    ("Madrid", "Madrid", "Madrid", "Madrid", "Madrid"), ("Vienna", "Vienne", "Wien", "Viena", "Vienna"),
    ("Lisbon", "Lisbonne", "Lissabon", "Lisboa", "Lisbona"), ("Geneva", "Genève", "Genf", "Ginebra", "Ginevra"),
    ("Milan", "Milan", "Mailand", "Milán", "Milano"), ("Brussels", "Bruxelles", "Brüssel", "Bruselas", "Bruxelles"),
    ("Athens", "Athènes", "Athen", "Atenas", "Atene"), ("Prague", "Prague", "Prag", "Praga", "Praga"),
    ("Warsaw", "Varsovie", "Warschau", "Varsovia", "Varsavia"), ("Venice", "Venise", "Venedig", "Venecia", "Venezia"),
    ("Florence", "Florence", "Florenz", "Florencia", "Firenze"), ("Naples", "Naples", "Neapel", "Nápoles", "Napoli"),
    ("Barcelona", "Barcelone", "Barcelona", "Barcelona", "Barcellona"), ("Zurich", "Zurich", "Zürich", "Zúrich", "Zurigo"),
    ("Amsterdam", "Amsterdam", "Amsterdam", "Ámsterdam", "Amsterdam"),
]

DAYS = [  # en, fr, de, es, it; French and Spanish plurals for "every Monday"
    ("Monday", "lundi", "Montag", "lunes", "lunedì"), ("Tuesday", "mardi", "Dienstag", "martes", "martedì"),
    ("Wednesday", "mercredi", "Mittwoch", "miércoles", "mercoledì"), ("Thursday", "jeudi", "Donnerstag", "jueves", "giovedì"),
    ("Friday", "vendredi", "Freitag", "viernes", "venerdì"), ("Saturday", "samedi", "Samstag", "sábado", "sabato"),
    ("Sunday", "dimanche", "Sonntag", "domingo", "domenica"),
]
DAYS_ES_PL = ["lunes", "martes", "miércoles", "jueves", "viernes", "sábados", "domingos"]
MONTHS = [  # en, fr, de, es, it, days in the month
    ("January", "janvier", "Januar", "enero", "gennaio", 31), ("February", "février", "Februar", "febrero", "febbraio", 28),
    ("March", "mars", "März", "marzo", "marzo", 31), ("April", "avril", "April", "abril", "aprile", 30),
    ("May", "mai", "Mai", "mayo", "maggio", 31), ("June", "juin", "Juni", "junio", "giugno", 30),
    ("July", "juillet", "Juli", "julio", "luglio", 31), ("August", "août", "August", "agosto", "agosto", 31),
    ("September", "septembre", "September", "septiembre", "settembre", 30), ("October", "octobre", "Oktober", "octubre", "ottobre", 31),
    ("November", "novembre", "November", "noviembre", "novembre", 30), ("December", "décembre", "Dezember", "diciembre", "dicembre", 31),
]
# Times of day: en, fr (after a day: "lundi matin"), de (compound: "Montagmorgen"), es, it
TIMES_OF_DAY = [("morning", "matin", "morgen", "por la mañana", "mattina"),
                ("afternoon", "après-midi", "nachmittag", "por la tarde", "pomeriggio"),
                ("evening", "soir", "abend", "por la noche", "sera")]
MINUTES = [0, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55]

EVENTS = [  # en, fr (with article), de (with article), es (with article), it (with article)
    ("meeting", "la réunion", "die Besprechung", "la reunión", "la riunione"),
    ("concert", "le concert", "das Konzert", "el concierto", "il concerto"),
    ("party", "la fête", "die Party", "la fiesta", "la festa"),
    ("exam", "l'examen", "die Prüfung", "el examen", "l'esame"),
    ("wedding", "le mariage", "die Hochzeit", "la boda", "il matrimonio"),
    ("match", "le match", "das Spiel", "el partido", "la partita"),
    ("dinner", "le dîner", "das Abendessen", "la cena", "la cena"),
    ("film", "le film", "der Film", "la película", "il film"),
]

# Simple time expressions per tense: en, fr, de, es, it
SIMPLE_TIMES = {
    "pres": [("every day", "tous les jours", "jeden Tag", "todos los días", "ogni giorno"),
             ("every week", "toutes les semaines", "jede Woche", "todas las semanas", "ogni settimana"),
             ("every morning", "tous les matins", "jeden Morgen", "todas las mañanas", "ogni mattina"),
             ("every evening", "tous les soirs", "jeden Abend", "todas las noches", "ogni sera")],
    "past": [("yesterday", "hier", "gestern", "ayer", "ieri"),
             ("last week", "la semaine dernière", "letzte Woche", "la semana pasada", "la settimana scorsa"),
             ("last month", "le mois dernier", "letzten Monat", "el mes pasado", "il mese scorso"),
             ("last year", "l'année dernière", "letztes Jahr", "el año pasado", "l'anno scorso")],
    "fut": [("tomorrow", "demain", "morgen", "mañana", "domani"),
            ("next week", "la semaine prochaine", "nächste Woche", "la próxima semana", "la settimana prossima"),
            ("next month", "le mois prochain", "nächsten Monat", "el próximo mes", "il mese prossimo"),
            ("next year", "l'année prochaine", "nächstes Jahr", "el próximo año", "l'anno prossimo"),
            ("tomorrow morning", "demain matin", "morgen früh", "mañana por la mañana", "domani mattina"),
            ("tomorrow evening", "demain soir", "morgen Abend", "mañana por la noche", "domani sera")],
}
YESTERDAY = ("yesterday", "hier", "gestern", "ayer", "ieri")
TOMORROW = ("tomorrow", "demain", "morgen", "mañana", "domani")

# ---------------------------------------------------------------------------------------------
# Numbers, dates, clock times
# ---------------------------------------------------------------------------------------------


def number_is_usable(n: int) -> bool:
    """Leave out numbers whose words change with the noun in some language.

    A final "one" agrees with the noun (fr "vingt et une", es "veintiún"/"veintiuna", it "ventun"),
    and num2words writes Spanish 21,000 as "veintiuno mil" where "veintiún mil" is right: skip them.
    """
    if n % 10 == 1 and n % 100 != 11:
        return False
    thousands = n // 1000
    if thousands > 1 and thousands % 10 == 1 and thousands % 100 != 11:
        return False
    return n >= 2


def cardinal(n: int, lang: str) -> str:
    words = num2words(n, lang=N2W[lang])
    if lang == "en":
        words = words.replace(",", "")  # "two thousand three hundred and five"
    if lang == "it" and n != 3 and words.endswith("tre"):
        words = words[:-3] + "tré"  # num2words writes "centoventitre" beside "ventitré"
    return words


def count_words(n: int, lang: str, gender: str) -> str:
    """The number before a plural noun of the given gender."""
    words = cardinal(n, lang)
    if lang == "es" and gender == "f":
        words = words.replace("ientos", "ientas")  # doscientas sillas, quinientas mesas
    return words


def date_words(day: int, month: int, lang: str) -> str:
    """'on the fifth of March' and its translations, with the preposition each language uses."""
    m = MONTHS[month]
    if lang == "en":
        return f"on the {num2words(day, lang='en', to='ordinal')} of {m[0]}"
    if lang == "fr":
        d = "premier" if day == 1 else cardinal(day, "fr")
        return f"le {d} {m[1]}"
    if lang == "de":
        return f"am {num2words(day, lang='de', to='ordinal')}n {m[2]}"  # am fünften März
    if lang == "es":
        d = "primero" if day == 1 else cardinal(day, "es")
        return f"el {d} de {m[3]}"
    d = "primo" if day == 1 else cardinal(day, "it")
    art = "l'" if d[0] in "aeiou" else "il "  # l'otto, l'undici
    return f"{art}{d} {m[4]}"


def clock_words(hour: int, minute: int, lang: str) -> str:
    """'at seven fifteen' and its translations (hours 1-12, minutes 0 or 10-55 in fives)."""
    h = cardinal(hour, lang)
    mm = cardinal(minute, lang) if minute else ""
    if lang == "en":
        return f"at {h} o'clock" if not minute else f"at {h} {mm}"
    if lang == "fr":
        h = "une" if hour == 1 else h
        return f"à {h} heure{'s' if hour > 1 else ''}" + (f" {mm}" if minute else "")
    if lang == "de":
        h = "ein" if hour == 1 else h
        return f"um {h} Uhr" + (f" {mm}" if minute else "")
    if lang == "es":
        base = "a la una" if hour == 1 else f"a las {h}"
        return base + (f" y {mm}" if minute else "")
    base = "all'una" if hour == 1 else f"alle {h}"
    return base + (f" e {mm}" if minute else "")


# ---------------------------------------------------------------------------------------------
# Time expressions: ("kind", values...) tuples rendered per language
# ---------------------------------------------------------------------------------------------


def render_time(t: tuple, lang: str) -> str:
    i = L.index(lang)
    kind = t[0]
    if kind == "simple":
        return SIMPLE_TIMES[t[1]][t[2]][i]
    if kind == "every_day":
        d = DAYS[t[1]]
        return {"en": f"every {d[0]}", "fr": f"tous les {d[1]}s", "de": f"jeden {d[2]}",
                "es": f"todos los {DAYS_ES_PL[t[1]]}", "it": f"ogni {d[4]}"}[lang]
    if kind == "day":
        d = DAYS[t[1]]
        return {"en": f"on {d[0]}", "fr": d[1], "de": f"am {d[2]}", "es": f"el {d[3]}", "it": d[4]}[lang]
    if kind == "day_tod":
        d, tod = DAYS[t[1]], TIMES_OF_DAY[t[2]]
        return {"en": f"on {d[0]} {tod[0]}", "fr": f"{d[1]} {tod[1]}", "de": f"am {d[2]}{tod[2]}",
                "es": f"el {d[3]} {tod[3]}", "it": f"{d[4]} {tod[4]}"}[lang]
    if kind == "month":
        m = MONTHS[t[1]]
        it = ("ad " if m[4][0] in "aeiou" else "a ") + m[4]  # ad aprile, a marzo
        return {"en": f"in {m[0]}", "fr": f"en {m[1]}", "de": f"im {m[2]}", "es": f"en {m[3]}", "it": it}[lang]
    if kind == "date":
        return date_words(t[1], t[2], lang)
    if kind == "date_clock":
        return date_words(t[1], t[2], lang) + " " + clock_words(t[3], t[4], lang)
    if kind == "yesterday_clock":
        return YESTERDAY[i] + " " + clock_words(t[1], t[2], lang)
    if kind == "tomorrow_clock":
        return TOMORROW[i] + " " + clock_words(t[1], t[2], lang)
    if kind == "day_clock":
        return render_time(("day", t[1]), lang) + " " + clock_words(t[2], t[3], lang)
    raise ValueError(f"unknown time expression {t!r}")


def sample_clock(rng: random.Random) -> tuple[int, int]:
    return rng.randint(1, 12), rng.choice(MINUTES)


def sample_date(rng: random.Random) -> tuple[int, int]:
    month = rng.randrange(12)
    return rng.randint(1, MONTHS[month][5]), month


def sample_time(rng: random.Random, tense: str) -> tuple:
    """A time expression that fits the tense (present: habitual; past and future: a point in time)."""
    if tense == "pres":
        r = rng.random()
        if r < 0.5:
            return ("every_day", rng.randrange(7))
        return ("simple", "pres", rng.randrange(len(SIMPLE_TIMES["pres"])))
    r = rng.random()
    if r < 0.18:
        return ("simple", tense, rng.randrange(len(SIMPLE_TIMES[tense])))
    if r < 0.33:
        return ("day", rng.randrange(7))
    if r < 0.46:
        return ("day_tod", rng.randrange(7), rng.randrange(3))
    if r < 0.58:
        return ("month", rng.randrange(12))
    if r < 0.76:
        return ("date",) + sample_date(rng)
    if r < 0.88:
        return ("yesterday_clock" if tense == "past" else "tomorrow_clock",) + sample_clock(rng)
    return ("day_clock", rng.randrange(7)) + sample_clock(rng)


# ---------------------------------------------------------------------------------------------
# Subjects and verbs
# ---------------------------------------------------------------------------------------------


def subject_info(s: tuple) -> tuple[str, str]:
    """(person, gender) of a subject: ("name", i) | ("family", possessive, i) | ("pron", person)."""
    if s[0] == "name":
        return "3sg", NAMES[s[1]][1]
    if s[0] == "family":
        return "3sg", FAMILY[s[2]][5]
    return s[1], "m"


def render_subject(s: tuple, lang: str) -> str:
    if s[0] == "name":
        return NAMES[s[1]][0]
    if s[0] == "family":
        f = FAMILY[s[2]]
        poss = POSSESSIVE[s[1]][lang][0 if f[5] == "m" else 1]
        return f"{poss} {f[L.index(lang)]}"
    return PRONOUNS[s[1]][lang]


def verb_parts(verb, tense: str, person: str, gender: str, lang: str, motion: bool = False) -> tuple[str, str]:
    """(finite part, final part). The final part is the participle or infinitive that German puts
    at the end of the clause; in the other languages it follows the auxiliary directly."""
    p = PERSONS.index(person)
    plural = person.endswith("pl")
    if motion:  # go / aller / fahren / ir / andare
        if lang == "en":
            return {"pres": ("goes" if person == "3sg" else "go"), "past": "went", "fut": "will go"}[tense], ""
        if lang == "fr":
            if tense == "pres":
                return ("vais", "va", "allons", "vont")[p], ""
            if tense == "fut":
                return "ir" + FUT_END["fr"][p], ""
            return AUX_BE["fr"][p] + " allé" + ("e" if gender == "f" else "") + ("s" if plural else ""), ""
        if lang == "de":
            if tense == "pres":
                return ("fahre", "fährt", "fahren", "fahren")[p], ""
            if tense == "past":
                return AUX_BE["de"][p], "gefahren"
            return WERDEN[p], "fahren"
        if lang == "es":
            return {"pres": ("voy", "va", "vamos", "van"), "past": ("fui", "fue", "fuimos", "fueron"),
                    "fut": tuple("ir" + e for e in FUT_END["es"])}[tense][p], ""
        if tense == "pres":
            return ("vado", "va", "andiamo", "vanno")[p], ""
        if tense == "fut":
            return "andr" + FUT_END["it"][p], ""
        ending = ("e" if gender == "f" else "i") if plural else ("a" if gender == "f" else "o")
        return AUX_BE["it"][p] + " andat" + ending, ""
    v = verb[lang]
    if lang == "en":
        base, s3, past = v
        return {"pres": s3 if person == "3sg" else base, "past": past, "fut": "will " + base}[tense], ""
    if lang == "fr":
        pres, part, fut = v
        return {"pres": pres[p], "past": AUX_HAVE["fr"][p] + " " + part, "fut": fut + FUT_END["fr"][p]}[tense], ""
    if lang == "de":
        pres, part, inf = v
        return {"pres": (pres[p], ""), "past": (AUX_HAVE["de"][p], part), "fut": (WERDEN[p], inf)}[tense]
    if lang == "es":
        pres, pret, inf = v
        return {"pres": pres[p], "past": pret[p], "fut": inf + FUT_END["es"][p]}[tense], ""
    pres, part, fut = v
    return {"pres": pres[p], "past": AUX_HAVE["it"][p] + " " + part, "fut": fut + FUT_END["it"][p]}[tense], ""


def finish(words: list[str], lang: str) -> str:
    """Join the words, apply French elision of je, capitalise the first letter, add the full stop."""
    text = " ".join(w for w in words if w)
    if lang == "fr" and text.startswith("je ") and text[3] in "aeiouéèêh":
        text = "j'" + text[3:]
    return text[0].upper() + text[1:] + "."


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------


def object_phrase(n: int, obj: int, col: int, lang: str) -> str:
    """'three red books' (German strong plural accusative: drei rote Bücher)."""
    o, c = OBJECTS[obj], COLOURS[col]
    if lang == "en":
        return f"{count_words(n, 'en', 'm')} {c[0]} {o[0][1]}"
    if lang == "de":
        return f"{count_words(n, 'de', 'm')} {c[2]}e {o[2][2]}"
    k = L.index(lang)  # OBJECTS and COLOURS share the order of L
    g, _, pl = o[k]
    adj = c[k][3 if g == "f" else 2]
    return f"{count_words(n, lang, g)} {pl} {adj}"


def render_buy(t: dict, lang: str) -> str:
    """Subject + verb + N coloured objects [+ place] + time."""
    person, gender = subject_info(t["subj"])
    fin, final = verb_parts(VERBS[t["verb"]], t["tense"], person, gender, lang)
    subj = render_subject(t["subj"], lang)
    obj = object_phrase(t["n"], t["obj"], t["col"], lang)
    place = PLACES[t["place"]][L.index(lang)] if t["place"] is not None else ""
    time = render_time(t["time"], lang)
    if lang == "de":  # verb second; time, place, object, then participle or infinitive
        return finish([subj, fin, time, place, obj, final], lang)
    return finish([subj, fin, obj, place, time], lang)


def render_travel(t: dict, lang: str) -> str:
    """Subject + go + to city + time."""
    person, gender = subject_info(t["subj"])
    fin, final = verb_parts(None, t["tense"], person, gender, lang, motion=True)
    subj = render_subject(t["subj"], lang)
    city = CITIES[t["city"]][L.index(lang)]
    to = {"en": "to", "fr": "à", "de": "nach", "es": "a", "it": "ad" if city[0] == "A" else "a"}[lang]
    time = render_time(t["time"], lang)
    if lang == "de":
        return finish([subj, fin, time, to, city, final], lang)
    return finish([subj, fin, to, city, time], lang)


def render_cost(t: dict, lang: str) -> str:
    """The coloured object costs N euros (present, past or future)."""
    o, c = OBJECTS[t["obj"]], COLOURS[t["col"]]
    n, tense = t["n"], t["tense"]
    euros = {"en": "euros", "fr": "euros", "de": "Euro", "es": "euros", "it": "euro"}[lang]
    amount = f"{cardinal(n, lang)} {euros}"
    if lang == "en":
        verb = {"pres": "costs", "past": "cost", "fut": "will cost"}[tense]
        return finish([f"the {c[0]} {o[0][0]}", verb, amount], lang)
    if lang == "de":
        g, sg, _ = o[2]
        art = {"m": "der", "f": "die", "n": "das"}[g]
        fin, final = {"pres": ("kostet", ""), "past": ("hat", "gekostet"), "fut": ("wird", "kosten")}[tense]
        return finish([f"{art} {c[2]}e {sg}", fin, amount, final], lang)
    if lang == "fr":
        g, sg, _ = o[1]
        noun = f"{'le' if g == 'm' else 'la'} {sg} {c[1][0 if g == 'm' else 1]}"
        verb = {"pres": "coûte", "past": "a coûté", "fut": "coûtera"}[tense]
        return finish([noun, verb, amount], lang)
    if lang == "es":
        g, sg, _ = o[3]
        noun = f"{'el' if g == 'm' else 'la'} {sg} {c[3][0 if g == 'm' else 1]}"
        verb = {"pres": "cuesta", "past": "costó", "fut": "costará"}[tense]
        return finish([noun, verb, amount], lang)
    g, sg, _ = o[4]
    noun = f"{sg} {c[4][0 if g == 'm' else 1]}"
    verb = {"pres": "costa", "past": "è costat" + ("o" if g == "m" else "a"), "fut": "costerà"}[tense]
    return finish([noun, verb, amount], lang)


def render_event(t: dict, lang: str) -> str:
    """The event is on <when>."""
    e = EVENTS[t["event"]]
    i = L.index(lang)
    noun = f"the {e[0]}" if lang == "en" else e[i]
    verb = {"en": "is", "fr": "est", "de": "ist", "es": "es", "it": "è"}[lang]
    return finish([noun, verb, render_time(t["time"], lang)], lang)


def render_birthday(t: dict, lang: str) -> str:
    """My / Anna's birthday is on <date>."""
    who = t["who"]
    date = date_words(t["day"], t["month"], lang)
    if who is None:
        owner = {"en": "my birthday", "fr": "mon anniversaire", "de": "mein Geburtstag",
                 "es": "mi cumpleaños", "it": "il mio compleanno"}[lang]
    else:
        name = NAMES[who][0]
        owner = {"en": f"{name}'s birthday",
                 "fr": "l'anniversaire " + (f"d'{name}" if name[0] in "AEIOUH" else f"de {name}"),
                 "de": f"{name}s Geburtstag", "es": f"el cumpleaños de {name}",
                 "it": f"il compleanno di {name}"}[lang]
    verb = {"en": "is", "fr": "est", "de": "ist", "es": "es", "it": "è"}[lang]
    return finish([owner, verb, date], lang)


RENDER = {"buy": render_buy, "travel": render_travel, "cost": render_cost, "event": render_event,
          "birthday": render_birthday}


def render(t: dict) -> list[str]:
    return [RENDER[t["tpl"]](t, lang) for lang in L]


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------


def sample_subject(rng: random.Random) -> tuple:
    r = rng.random()
    if r < 0.45:
        return ("name", rng.randrange(len(NAMES)))
    if r < 0.75:
        return ("family", rng.choice(["my", "our"]), rng.randrange(len(FAMILY)))
    return ("pron", rng.choice(["1sg", "1pl", "3pl"]))


def sample_count(rng: random.Random, allowed) -> int:
    while True:
        r = rng.random()
        n = rng.randint(2, 20) if r < 0.45 else rng.randint(21, 100) if r < 0.75 else rng.randint(101, 999)
        if number_is_usable(n) and allowed(n):
            return n


def sample_price(rng: random.Random, allowed) -> int:
    while True:
        r = rng.random()
        n = rng.randint(2, 100) if r < 0.25 else rng.randint(101, 999) if r < 0.5 else rng.randint(1000, 99999)
        if number_is_usable(n) and allowed(n):
            return n


def sample_tuple(rng: random.Random, allowed) -> dict:
    r = rng.random()
    tense = rng.choice(["pres", "past", "fut"])
    if r < 0.36:
        return dict(tpl="buy", subj=sample_subject(rng), verb=rng.randrange(len(VERBS)), tense=tense,
                    n=sample_count(rng, allowed), obj=rng.randrange(len(OBJECTS)), col=rng.randrange(len(COLOURS)),
                    place=rng.randrange(len(PLACES)) if rng.random() < 0.4 else None,
                    time=sample_time(rng, tense))
    if r < 0.56:
        return dict(tpl="travel", subj=sample_subject(rng), tense=tense, city=rng.randrange(len(CITIES)),
                    time=sample_time(rng, tense))
    if r < 0.80:
        return dict(tpl="cost", obj=rng.randrange(len(OBJECTS)), col=rng.randrange(len(COLOURS)),
                    n=sample_price(rng, allowed), tense=tense)
    if r < 0.92:
        kind = rng.random()
        if kind < 0.25:
            time = ("date",) + sample_date(rng)
        elif kind < 0.45:
            time = ("date_clock",) + sample_date(rng) + sample_clock(rng)
        elif kind < 0.65:
            time = ("day_clock", rng.randrange(7)) + sample_clock(rng)
        elif kind < 0.8:
            time = ("tomorrow_clock",) + sample_clock(rng)
        else:
            time = sample_time(rng, "fut")
        return dict(tpl="event", event=rng.randrange(len(EVENTS)), time=time)
    day, month = sample_date(rng)
    return dict(tpl="birthday", who=None if rng.random() < 0.3 else rng.randrange(len(NAMES)), day=day, month=month)


def key(t: dict) -> tuple:
    return tuple(sorted((k, v if not isinstance(v, list) else tuple(v)) for k, v in t.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / ".scratch" / "data"))
    ap.add_argument("--train", type=int, default=200_000, help="number of training tuples")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # Numbers reserved for held-out sentences: training never sees them (except 2..20, too few to spare).
    candidates = [n for n in range(21, 100_000) if number_is_usable(n)]
    reserved = set(rng.sample(candidates, len(candidates) // 20))

    heldout, seen = [], set()
    while len(heldout) < HELDOUT_TUPLES:
        use_reserved = len(heldout) % 2 == 0  # half the held-out number sentences use a reserved number
        t = sample_tuple(rng, (lambda n: n in reserved or n <= 20) if use_reserved else (lambda n: n not in reserved))
        k = key(t)
        if k not in seen:
            seen.add(k)
            heldout.append(t)
    heldout_sentences = {s for t in heldout for s in render(t)}

    train, train_keys = [], set()
    while len(train) < args.train:
        t = sample_tuple(rng, lambda n: n not in reserved)
        k = key(t)
        if k in seen or k in train_keys:
            continue
        rows = render(t)
        if any(s in heldout_sentences for s in rows):  # also no rendering of a held-out sentence
            continue
        train_keys.add(k)
        train.append(rows)
    held_rows = [render(t) for t in heldout]

    # Every source sentence must have one right translation: no two tuples may share a rendering.
    for i, lang in enumerate(LANGS):
        owner: dict[str, tuple] = {}
        for rows in train + held_rows:
            prev = owner.setdefault(rows[i], tuple(rows))
            if prev != tuple(rows):
                raise SystemExit(f"ambiguous {lang} sentence {rows[i]!r}:\n  {prev}\n  {tuple(rows)}")

    with open(out / "train.tsv", "w", encoding="utf-8") as f:
        f.writelines("\t".join(r) + "\n" for r in train)
    with open(out / "heldout.tsv", "w", encoding="utf-8") as f:
        f.writelines("\t".join(r) + "\n" for r in held_rows)
    shipped = REPO / "data" / "samples" / "heldout"
    shipped.mkdir(parents=True, exist_ok=True)
    for i, lang in enumerate(LANGS):
        with open(shipped / f"{lang}.txt", "w", encoding="utf-8") as f:
            f.writelines(r[i] + "\n" for r in held_rows[:HELDOUT_SHIPPED])
    print(f"{len(train)} training tuples, {len(held_rows)} held-out tuples, {len(reserved)} reserved numbers -> {out}")


if __name__ == "__main__":
    main()
