"""Static reference tables: status and trade types, industries, regions and tax rates.

StatusType and TradeType are fixed by the specification. Industry and TaxRate have DIGen's
shapes (102 industries in 12 sectors, 320 tax rates with five decimals) but our own content:
DIGen's files may not be redistributed, and DimTrade only needs their keys to exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

STATUS_TYPES: tuple[tuple[str, str], ...] = (
    ("ACTV", "Active"), ("CMPT", "Completed"), ("CNCL", "Canceled"),
    ("PNDG", "Pending"), ("SBMT", "Submitted"), ("INAC", "Inactive"),
)

#: TT_ID, TT_NAME, TT_IS_SELL, TT_IS_MRKT
TRADE_TYPES: tuple[tuple[str, str, int, int], ...] = (
    ("TMB", "Market Buy", 0, 1), ("TMS", "Market Sell", 1, 1), ("TSL", "Stop Loss", 1, 1),
    ("TLS", "Limit Sell", 1, 0), ("TLB", "Limit Buy", 0, 0),
)

#: sector id -> the industries in it, as "IN_ID Name".
_INDUSTRIES_BY_SECTOR: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "BM": ("AG Agricultural Chemicals", "AL Aluminum", "CM Chemical Manufacturing",
           "CP Chemicals Plastics and Rubber", "CT Containers and Packaging",
           "FP Fabricated Plastic and Rubber", "FW Forestry and Wood Products",
           "GS Gold and Silver", "IS Iron and Steel", "MM Metal Mining",
           "NM Non Metallic Mining", "PA Paper and Paper Products"),
    "CG": ("AD Aerospace and Defense", "CA Construction and Agricultural Machinery",
           "CS Construction Services", "CF Construction Supplies and Fixtures",
           "MH Mobile Homes and RVs", "MC Misc Capital Goods", "IM Industrial Machinery"),
    "CO": ("CG Conglomerates",),
    "CC": ("AP Apparel Accessories", "AC Appliance and Tool", "AU Audio and Video Equipment",
           "AR Auto and Truck Manufacturers", "AT Auto and Truck Parts", "FF Footwear",
           "FU Furniture and Fixtures", "JS Jewelry and Silverware", "PR Photography",
           "RC Recreational Products", "TX Textiles Non Apparel", "TI Tires"),
    "CN": ("BE Beverages Alcoholic", "BN Beverages Non Alcoholic", "CR Crops",
           "FI Fish and Livestock", "FO Food Processing", "OP Office Supplies",
           "PE Personal and Household Products", "TB Tobacco"),
    "EN": ("CO Coal", "OG Oil and Gas Integrated", "OO Oil and Gas Operations",
           "OW Oil Well Services and Equipment"),
    "FN": ("CB Consumer Financial Services", "IB Insurance Accident and Health",
           "IL Insurance Life", "IP Insurance Property and Casualty",
           "IV Investment Services", "MB Misc Financial Services", "MR Money Center Banks",
           "RB Regional Banks", "SL Savings and Loans"),
    "HC": ("BD Biotechnology and Drugs", "HF Healthcare Facilities",
           "MD Major Drugs", "ME Medical Equipment and Supplies"),
    "SV": ("AS Advertising", "BS Business Services", "CI Casinos and Gaming",
           "CX Communications Services", "HM Hotels and Motels",
           "MP Motion Pictures", "PB Printing and Publishing", "PS Personal Services",
           "RE Real Estate Operations", "RN Rental and Leasing", "RA Restaurants",
           "RT Retail Apparel", "RD Retail Catalog and Mail Order",
           "RQ Retail Department and Discount", "RG Retail Drugs", "RL Retail Grocery",
           "RH Retail Home Improvement",
           "RS Retail Specialty", "RY Retail Technology", "SE Schools", "SC Security Systems",
           "WA Waste Management Services", "BR Broadcasting and Cable TV",
           "RF Recreational Activities"),
    "TC": ("CE Communications Equipment", "CH Computer Hardware", "CN Computer Networks",
           "CD Computer Peripherals", "CV Computer Services", "CW Computer Storage Devices",
           "EL Electronic Instruments and Controls", "OE Office Equipment",
           "SW Software and Programming", "SM Scientific and Technical Instruments",
           "SQ Semiconductors"),
    "TR": ("AI Air Courier", "AX Airline", "MS Misc Transportation", "RR Railroads",
           "TK Trucking", "WT Water Transportation"),
    "UT": ("EU Electric Utilities", "NG Natural Gas Utilities", "WU Water Utilities",
           "TL Communications Utilities"),
})


def _industries() -> tuple[tuple[str, str, str], ...]:
    """(IN_ID, IN_NAME, IN_SC_ID) rows; ids are unique two-letter codes."""
    rows = tuple((entry[:2], entry[3:], sector)
                 for sector, entries in _INDUSTRIES_BY_SECTOR.items() for entry in entries)
    assert len({row[0] for row in rows}) == len(rows), "industry ids must be unique"
    return rows


#: Industry.txt rows: IN_ID, IN_NAME, IN_SC_ID (102, as in DIGen).
INDUSTRIES: tuple[tuple[str, str, str], ...] = _industries()

US_STATES: tuple[tuple[str, str], ...] = (
    ("AL", "Alabama"), ("AK", "Alaska"), ("AZ", "Arizona"), ("AR", "Arkansas"),
    ("CA", "California"), ("CO", "Colorado"), ("CT", "Connecticut"), ("DE", "Delaware"),
    ("DC", "District of Columbia"), ("FL", "Florida"), ("GA", "Georgia"), ("HI", "Hawaii"),
    ("ID", "Idaho"), ("IL", "Illinois"), ("IN", "Indiana"), ("IA", "Iowa"), ("KS", "Kansas"),
    ("KY", "Kentucky"), ("LA", "Louisiana"), ("ME", "Maine"), ("MD", "Maryland"),
    ("MA", "Massachusetts"), ("MI", "Michigan"), ("MN", "Minnesota"), ("MS", "Mississippi"),
    ("MO", "Missouri"), ("MT", "Montana"), ("NE", "Nebraska"), ("NV", "Nevada"),
    ("NH", "New Hampshire"), ("NJ", "New Jersey"), ("NM", "New Mexico"), ("NY", "New York"),
    ("NC", "North Carolina"), ("ND", "North Dakota"), ("OH", "Ohio"), ("OK", "Oklahoma"),
    ("OR", "Oregon"), ("PA", "Pennsylvania"), ("RI", "Rhode Island"),
    ("SC", "South Carolina"), ("SD", "South Dakota"), ("TN", "Tennessee"), ("TX", "Texas"),
    ("UT", "Utah"), ("VT", "Vermont"), ("VA", "Virginia"), ("WA", "Washington"),
    ("WV", "West Virginia"), ("WI", "Wisconsin"), ("WY", "Wyoming"),
)
CA_PROVINCES: tuple[tuple[str, str], ...] = (
    ("AB", "Alberta"), ("BC", "British Columbia"), ("MB", "Manitoba"), ("NB", "New Brunswick"),
    ("NL", "Newfoundland and Labrador"), ("NS", "Nova Scotia"), ("NT", "Northwest Territories"),
    ("NU", "Nunavut"), ("ON", "Ontario"), ("PE", "Prince Edward Island"), ("QC", "Quebec"),
    ("SK", "Saskatchewan"), ("YT", "Yukon"),
)
US_COUNTRY = "United States of America"
CA_COUNTRY = "Canada"

US_BRACKETS = 5   # local brackets per US state and national US brackets
CA_BRACKETS = 4   # local brackets per province and national Canadian brackets


def _tax_rates() -> tuple[tuple[str, str, str], ...]:
    """(TX_ID, TX_NAME, TX_RATE) rows: national and local brackets, 320 in all.

    Rates are a fixed function of the position (not random), so TaxRate.txt is the same for
    every seed, as DIGen's static file is.
    """
    rows: list[tuple[str, str, str]] = []
    for k, rate in enumerate((0.10, 0.15, 0.25, 0.28, 0.33), start=1):
        rows.append((f"US{k}", f"US Federal Income Tax Bracket {k}", f"{rate:.5f}"))
    for k, rate in enumerate((0.15, 0.22, 0.26, 0.29), start=1):
        rows.append((f"CN{k}", f"Canadian Federal Income Tax Bracket {k}", f"{rate:.5f}"))
    regions = [(code, name, US_BRACKETS) for code, name in US_STATES]
    regions += [(code, name, CA_BRACKETS) for code, name in CA_PROVINCES]
    regions.append(("PR", "Puerto Rico", 4))
    for i, (code, name, brackets) in enumerate(regions):
        for k in range(1, brackets + 1):
            rate = ((i * 37 + k * 11) % 60) / 1000 + 0.01 * k
            rows.append((f"{code}{k}", f"{name} Tax Bracket {k}", f"{rate:.5f}"))
    return tuple(rows)


#: TaxRate.txt rows.
TAX_RATES: tuple[tuple[str, str, str], ...] = _tax_rates()
