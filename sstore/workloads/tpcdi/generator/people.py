"""Plausible values for people, places and companies (HR, customers, FINWIRE CMP records).

Values only need the right shape (lengths, character sets, formats of the layouts document);
they come from short word lists plus random letters so that names are varied without shipping
large dictionaries. Nothing here may contain '|' or ',' (HR.csv is comma separated, unquoted).
"""

from __future__ import annotations

from dataclasses import dataclass

from .rand import Draw
from .reference_data import CA_COUNTRY, CA_PROVINCES, US_COUNTRY, US_STATES

FIRST_NAMES = (
    "James", "Mary", "John", "Patricia", "Robert", "Jennifer", "Michael", "Linda", "William",
    "Elizabeth", "David", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah",
    "Charles", "Karen", "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark",
    "Margaret", "Donald", "Sandra", "Steven", "Ashley", "Paul", "Kimberly", "Andrew", "Emily",
    "Joshua", "Donna", "Kenneth", "Michelle", "Kevin", "Carol", "Brian", "Amanda", "George",
    "Melissa", "Edward", "Deborah", "Ronald", "Stephanie", "Adara", "Joannis", "Wen", "Priya",
)
LAST_NAMES = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez",
    "Martinez", "Hernandez", "Lopez", "Gonzalez", "Wilson", "Anderson", "Thomas", "Taylor",
    "Moore", "Jackson", "Martin", "Lee", "Perez", "Thompson", "White", "Harris", "Sanchez",
    "Clark", "Ramirez", "Lewis", "Robinson", "Walker", "Young", "Allen", "King", "Wright",
    "Scott", "Torres", "Nguyen", "Hill", "Flores", "Green", "Adams", "Nelson", "Baker", "Hall",
    "Rivera", "Campbell", "Mitchell", "Carter", "Roberts", "Okafor", "Tanaka", "Kowalski",
)
_STREETS = ("Main", "Oak", "Pine", "Maple", "Cedar", "Elm", "Washington", "Lake", "Hill",
            "Park", "Sunset", "Railroad", "Church", "Willow", "Highland", "River", "Mill")
_STREET_KINDS = ("Street", "Avenue", "Road", "Boulevard", "Lane", "Drive", "Court", "Way")
_CITY_PARTS = ("Spring", "Fair", "Green", "Oak", "River", "Clear", "Maple", "Rock", "West",
               "East", "North", "Lake", "Glen", "Wood", "Bridge", "Ash", "Stone", "Brook")
_CITY_ENDS = ("field", "ville", "ton", "wood", "view", "dale", "port", "burg", " City",
              " Falls", " Springs", " Heights")
_COMPANY_ENDS = ("Corporation", "Incorporated", "Holdings", "Group", "Industries",
                 "Technologies", "Partners", "Systems", "Enterprises", "International")
_EMAIL_DOMAINS = ("example.com", "mail.example.org", "inbox.example.net", "post.example.com")


@dataclass(frozen=True)
class Place:
    """A postal address."""

    line1: str
    line2: str
    postal_code: str
    city: str
    state_province: str
    country: str


def person(draw: Draw) -> tuple[str, str, str]:
    """(first, last, middle initial or '')."""
    middle = draw.letters(1) if draw.chance(0.7) else ""
    return draw.pick(FIRST_NAMES), draw.pick(LAST_NAMES), middle


def street(draw: Draw) -> str:
    """A street address line."""
    return f"{draw.integer(1, 9999)} {draw.pick(_STREETS)} {draw.pick(_STREET_KINDS)}"


def city(draw: Draw) -> str:
    """A town name."""
    return draw.pick(_CITY_PARTS) + draw.pick(_CITY_ENDS)


def place(draw: Draw, canadian_share: float = 0.2) -> Place:
    """An address in the United States or (``canadian_share``) Canada."""
    line2 = f"Suite {draw.integer(1, 999)}" if draw.chance(0.2) else ""
    if draw.chance(canadian_share):
        code = draw.pick(CA_PROVINCES)[0]
        postal = (f"{draw.letters(1)}{draw.digits(1)}{draw.letters(1)} "
                  f"{draw.digits(1)}{draw.letters(1)}{draw.digits(1)}")
        return Place(street(draw), line2, postal, city(draw), code, CA_COUNTRY)
    code = draw.pick(US_STATES)[0]
    return Place(street(draw), line2, draw.digits(5), city(draw), code, US_COUNTRY)


def us_phone(draw: Draw) -> str:
    """``(ddd) ddd-dddd``."""
    return f"({draw.integer(201, 989)}) {draw.integer(200, 999)}-{draw.digits(4)}"


def email(draw: Draw, first: str, last: str) -> str:
    """An address at one of a few example domains."""
    return f"{first}.{last}{draw.integer(1, 999)}@{draw.pick(_EMAIL_DOMAINS)}"


def company_name(draw: Draw, taken: set[str]) -> str:
    """A new company name, 15-60 letters and spaces, unique among ``taken`` (updated)."""
    while True:
        name = f"{draw.word(4, 10)} {draw.word(3, 10)} {draw.pick(_COMPANY_ENDS)}"
        if 15 <= len(name) <= 60 and name not in taken:
            taken.add(name)
            return name
