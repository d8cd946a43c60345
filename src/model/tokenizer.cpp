// Shared tokenizer pieces: UTF-8, Unicode classes, the normalizer, JSON
// helpers, the added-token / template pipeline and the loaders' dispatch.
#include "model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "core/io.h"
#include "model/tokenizer_impl.h"

namespace tessera::model::tok {
namespace {

struct CodeRange {
  char32_t first, last;
};
struct CaseRange {
  char32_t first, last;
  int32_t stride, delta;
};
struct CodePair {
  char32_t from, to;
};
struct CodeTriple {
  char32_t from, first, second;
};
// Bases for code points first..last; '.' marks one without a decomposition.
struct DecompositionBlock {
  char32_t first, last;
  const char32_t* bases;
};

// Tables generated from Python's unicodedata (Unicode 14). Category ranges
// are merged across unassigned code points, which real text does not use.
// clang-format off
constexpr CodeRange kLetterRanges[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6},
    {0xD8, 0xF6}, {0xF8, 0x2C1}, {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE},
    {0x370, 0x374}, {0x376, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x559}, {0x560, 0x588}, {0x5D0, 0x5F2}, {0x620, 0x64A}, {0x66E, 0x66F}, {0x671, 0x6D3},
    {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF}, {0x710, 0x710},
    {0x712, 0x72F}, {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7CA, 0x7EA}, {0x7F4, 0x7F5}, {0x7FA, 0x7FA},
    {0x800, 0x815}, {0x81A, 0x81A}, {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858}, {0x860, 0x887},
    {0x889, 0x88E}, {0x8A0, 0x8C9}, {0x904, 0x939}, {0x93D, 0x93D}, {0x950, 0x950}, {0x958, 0x961},
    {0x971, 0x980}, {0x985, 0x9B9}, {0x9BD, 0x9BD}, {0x9CE, 0x9CE}, {0x9DC, 0x9E1}, {0x9F0, 0x9F1},
    {0x9FC, 0x9FC}, {0xA05, 0xA39}, {0xA59, 0xA5E}, {0xA72, 0xA74}, {0xA85, 0xAB9}, {0xABD, 0xABD},
    {0xAD0, 0xAE1}, {0xAF9, 0xAF9}, {0xB05, 0xB39}, {0xB3D, 0xB3D}, {0xB5C, 0xB61}, {0xB71, 0xB71},
    {0xB83, 0xBB9}, {0xBD0, 0xBD0}, {0xC05, 0xC39}, {0xC3D, 0xC3D}, {0xC58, 0xC61}, {0xC80, 0xC80},
    {0xC85, 0xCB9}, {0xCBD, 0xCBD}, {0xCDD, 0xCE1}, {0xCF1, 0xCF2}, {0xD04, 0xD3A}, {0xD3D, 0xD3D},
    {0xD4E, 0xD4E}, {0xD54, 0xD56}, {0xD5F, 0xD61}, {0xD7A, 0xD7F}, {0xD85, 0xDC6}, {0xE01, 0xE30},
    {0xE32, 0xE33}, {0xE40, 0xE46}, {0xE81, 0xEB0}, {0xEB2, 0xEB3}, {0xEBD, 0xEC6}, {0xEDC, 0xF00},
    {0xF40, 0xF6C}, {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x103F}, {0x1050, 0x1055},
    {0x105A, 0x105D}, {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070}, {0x1075, 0x1081},
    {0x108E, 0x108E}, {0x10A0, 0x10FA}, {0x10FC, 0x135A}, {0x1380, 0x138F}, {0x13A0, 0x13FD},
    {0x1401, 0x166C}, {0x166F, 0x167F}, {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16F1, 0x1711},
    {0x171F, 0x1731}, {0x1740, 0x1751}, {0x1760, 0x1770}, {0x1780, 0x17B3}, {0x17D7, 0x17D7},
    {0x17DC, 0x17DC}, {0x1820, 0x1884}, {0x1887, 0x18A8}, {0x18AA, 0x191E}, {0x1950, 0x19C9},
    {0x1A00, 0x1A16}, {0x1A20, 0x1A54}, {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33}, {0x1B45, 0x1B4C},
    {0x1B83, 0x1BA0}, {0x1BAE, 0x1BAF}, {0x1BBA, 0x1BE5}, {0x1C00, 0x1C23}, {0x1C4D, 0x1C4F},
    {0x1C5A, 0x1C7D}, {0x1C80, 0x1CBF}, {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6},
    {0x1CFA, 0x1DBF}, {0x1E00, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FCC}, {0x1FD0, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FFC}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C},
    {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D},
    {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2139},
    {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0x2D00, 0x2D6F}, {0x2D80, 0x2DDE}, {0x2E2F, 0x2E2F},
    {0x3005, 0x3006}, {0x3031, 0x3035}, {0x303B, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F},
    {0x30A1, 0x30FA}, {0x30FC, 0x318E}, {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3400, 0x4DBF},
    {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD}, {0xA500, 0xA60C}, {0xA610, 0xA61F}, {0xA62A, 0xA66E},
    {0xA67F, 0xA69D}, {0xA6A0, 0xA6E5}, {0xA717, 0xA71F}, {0xA722, 0xA788}, {0xA78B, 0xA801},
    {0xA803, 0xA805}, {0xA807, 0xA80A}, {0xA80C, 0xA822}, {0xA840, 0xA873}, {0xA882, 0xA8B3},
    {0xA8F2, 0xA8F7}, {0xA8FB, 0xA8FB}, {0xA8FD, 0xA8FE}, {0xA90A, 0xA925}, {0xA930, 0xA946},
    {0xA960, 0xA97C}, {0xA984, 0xA9B2}, {0xA9CF, 0xA9CF}, {0xA9E0, 0xA9E4}, {0xA9E6, 0xA9EF},
    {0xA9FA, 0xAA28}, {0xAA40, 0xAA42}, {0xAA44, 0xAA4B}, {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A},
    {0xAA7E, 0xAAAF}, {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6}, {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0},
    {0xAAC2, 0xAADD}, {0xAAE0, 0xAAEA}, {0xAAF2, 0xAAF4}, {0xAB01, 0xAB5A}, {0xAB5C, 0xAB69},
    {0xAB70, 0xABE2}, {0xAC00, 0xD7FB}, {0xF900, 0xFB1D}, {0xFB1F, 0xFB28}, {0xFB2A, 0xFBB1},
    {0xFBD3, 0xFD3D}, {0xFD50, 0xFDC7}, {0xFDF0, 0xFDFB}, {0xFE70, 0xFEFC}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0xFF66, 0xFFDC}, {0x10000, 0x100FA}, {0x10280, 0x102D0}, {0x10300, 0x1031F},
    {0x1032D, 0x10340}, {0x10342, 0x10349}, {0x10350, 0x10375}, {0x10380, 0x1039D},
    {0x103A0, 0x103CF}, {0x10400, 0x1049D}, {0x104B0, 0x10563}, {0x10570, 0x10855},
    {0x10860, 0x10876}, {0x10880, 0x1089E}, {0x108E0, 0x108F5}, {0x10900, 0x10915},
    {0x10920, 0x10939}, {0x10980, 0x109B7}, {0x109BE, 0x109BF}, {0x10A00, 0x10A00},
    {0x10A10, 0x10A35}, {0x10A60, 0x10A7C}, {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7},
    {0x10AC9, 0x10AE4}, {0x10B00, 0x10B35}, {0x10B40, 0x10B55}, {0x10B60, 0x10B72},
    {0x10B80, 0x10B91}, {0x10C00, 0x10CF2}, {0x10D00, 0x10D23}, {0x10E80, 0x10EA9},
    {0x10EB0, 0x10F1C}, {0x10F27, 0x10F45}, {0x10F70, 0x10F81}, {0x10FB0, 0x10FC4},
    {0x10FE0, 0x10FF6}, {0x11003, 0x11037}, {0x11071, 0x11072}, {0x11075, 0x11075},
    {0x11083, 0x110AF}, {0x110D0, 0x110E8}, {0x11103, 0x11126}, {0x11144, 0x11144},
    {0x11147, 0x11172}, {0x11176, 0x11176}, {0x11183, 0x111B2}, {0x111C1, 0x111C4},
    {0x111DA, 0x111DA}, {0x111DC, 0x111DC}, {0x11200, 0x1122B}, {0x11280, 0x112A8},
    {0x112B0, 0x112DE}, {0x11305, 0x11339}, {0x1133D, 0x1133D}, {0x11350, 0x11350},
    {0x1135D, 0x11361}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x1145F, 0x114AF},
    {0x114C4, 0x114C5}, {0x114C7, 0x114C7}, {0x11580, 0x115AE}, {0x115D8, 0x115DB},
    {0x11600, 0x1162F}, {0x11644, 0x11644}, {0x11680, 0x116AA}, {0x116B8, 0x116B8},
    {0x11700, 0x1171A}, {0x11740, 0x1182B}, {0x118A0, 0x118DF}, {0x118FF, 0x1192F},
    {0x1193F, 0x1193F}, {0x11941, 0x11941}, {0x119A0, 0x119D0}, {0x119E1, 0x119E1},
    {0x119E3, 0x119E3}, {0x11A00, 0x11A00}, {0x11A0B, 0x11A32}, {0x11A3A, 0x11A3A},
    {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D}, {0x11AB0, 0x11C2E},
    {0x11C40, 0x11C40}, {0x11C72, 0x11C8F}, {0x11D00, 0x11D30}, {0x11D46, 0x11D46},
    {0x11D60, 0x11D89}, {0x11D98, 0x11D98}, {0x11EE0, 0x11EF2}, {0x11FB0, 0x11FB0},
    {0x12000, 0x12399}, {0x12480, 0x12FF0}, {0x13000, 0x1342E}, {0x14400, 0x16A5E},
    {0x16A70, 0x16ABE}, {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F}, {0x16B40, 0x16B43},
    {0x16B63, 0x16E7F}, {0x16F00, 0x16F4A}, {0x16F50, 0x16F50}, {0x16F93, 0x16FE1},
    {0x16FE3, 0x16FE3}, {0x17000, 0x1BC99}, {0x1D400, 0x1D6C0}, {0x1D6C2, 0x1D6DA},
    {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734}, {0x1D736, 0x1D74E},
    {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8}, {0x1D7AA, 0x1D7C2},
    {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1E100, 0x1E12C}, {0x1E137, 0x1E13D},
    {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB}, {0x1E7E0, 0x1E8C4},
    {0x1E900, 0x1E943}, {0x1E94B, 0x1E94B}, {0x1EE00, 0x1EEBB}, {0x20000, 0x3134A},
};
constexpr CodeRange kNumberRanges[] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9},
    {0x7C0, 0x7C9}, {0x966, 0x96F}, {0x9E6, 0x9EF}, {0x9F4, 0x9F9}, {0xA66, 0xA6F}, {0xAE6, 0xAEF},
    {0xB66, 0xB6F}, {0xB72, 0xB77}, {0xBE6, 0xBF2}, {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xCE6, 0xCEF},
    {0xD58, 0xD5E}, {0xD66, 0xD78}, {0xDE6, 0xDEF}, {0xE50, 0xE59}, {0xED0, 0xED9}, {0xF20, 0xF33},
    {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17F9},
    {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A99}, {0x1B50, 0x1B59},
    {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070}, {0x2074, 0x2079},
    {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF},
    {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A},
    {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289},
    {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835}, {0xA8D0, 0xA8D9},
    {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9},
    {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x10178}, {0x1018A, 0x1018B},
    {0x102E1, 0x102FB}, {0x10320, 0x10323}, {0x10341, 0x10341}, {0x1034A, 0x1034A},
    {0x103D1, 0x103D5}, {0x104A0, 0x104A9}, {0x10858, 0x1085F}, {0x10879, 0x1087F},
    {0x108A7, 0x108AF}, {0x108FB, 0x108FF}, {0x10916, 0x1091B}, {0x109BC, 0x109BD},
    {0x109C0, 0x109FF}, {0x10A40, 0x10A48}, {0x10A7D, 0x10A7E}, {0x10A9D, 0x10A9F},
    {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F}, {0x10B78, 0x10B7F}, {0x10BA9, 0x10BAF},
    {0x10CFA, 0x10CFF}, {0x10D30, 0x10E7E}, {0x10F1D, 0x10F26}, {0x10F51, 0x10F54},
    {0x10FC5, 0x10FCB}, {0x11052, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F},
    {0x111D0, 0x111D9}, {0x111E1, 0x111F4}, {0x112F0, 0x112F9}, {0x11450, 0x11459},
    {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x1173B},
    {0x118E0, 0x118F2}, {0x11950, 0x11959}, {0x11C50, 0x11C6C}, {0x11D50, 0x11D59},
    {0x11DA0, 0x11DA9}, {0x11FC0, 0x11FD4}, {0x12400, 0x1246E}, {0x16A60, 0x16A69},
    {0x16AC0, 0x16AC9}, {0x16B50, 0x16B61}, {0x16E80, 0x16E96}, {0x1D2E0, 0x1D2F3},
    {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9},
    {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF},
    {0x1ECB1, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};
constexpr CodeRange kNonspacingMarkRanges[] = {
    {0x300, 0x36F}, {0x483, 0x487}, {0x591, 0x5BD}, {0x5BF, 0x5BF}, {0x5C1, 0x5C2}, {0x5C4, 0x5C5},
    {0x5C7, 0x5C7}, {0x610, 0x61A}, {0x64B, 0x65F}, {0x670, 0x670}, {0x6D6, 0x6DC}, {0x6DF, 0x6E4},
    {0x6E7, 0x6E8}, {0x6EA, 0x6ED}, {0x711, 0x711}, {0x730, 0x74A}, {0x7A6, 0x7B0}, {0x7EB, 0x7F3},
    {0x7FD, 0x7FD}, {0x816, 0x819}, {0x81B, 0x823}, {0x825, 0x827}, {0x829, 0x82D}, {0x859, 0x85B},
    {0x898, 0x89F}, {0x8CA, 0x8E1}, {0x8E3, 0x902}, {0x93A, 0x93A}, {0x93C, 0x93C}, {0x941, 0x948},
    {0x94D, 0x94D}, {0x951, 0x957}, {0x962, 0x963}, {0x981, 0x981}, {0x9BC, 0x9BC}, {0x9C1, 0x9C4},
    {0x9CD, 0x9CD}, {0x9E2, 0x9E3}, {0x9FE, 0xA02}, {0xA3C, 0xA3C}, {0xA41, 0xA51}, {0xA70, 0xA71},
    {0xA75, 0xA75}, {0xA81, 0xA82}, {0xABC, 0xABC}, {0xAC1, 0xAC8}, {0xACD, 0xACD}, {0xAE2, 0xAE3},
    {0xAFA, 0xB01}, {0xB3C, 0xB3C}, {0xB3F, 0xB3F}, {0xB41, 0xB44}, {0xB4D, 0xB56}, {0xB62, 0xB63},
    {0xB82, 0xB82}, {0xBC0, 0xBC0}, {0xBCD, 0xBCD}, {0xC00, 0xC00}, {0xC04, 0xC04}, {0xC3C, 0xC3C},
    {0xC3E, 0xC40}, {0xC46, 0xC56}, {0xC62, 0xC63}, {0xC81, 0xC81}, {0xCBC, 0xCBC}, {0xCBF, 0xCBF},
    {0xCC6, 0xCC6}, {0xCCC, 0xCCD}, {0xCE2, 0xCE3}, {0xD00, 0xD01}, {0xD3B, 0xD3C}, {0xD41, 0xD44},
    {0xD4D, 0xD4D}, {0xD62, 0xD63}, {0xD81, 0xD81}, {0xDCA, 0xDCA}, {0xDD2, 0xDD6}, {0xE31, 0xE31},
    {0xE34, 0xE3A}, {0xE47, 0xE4E}, {0xEB1, 0xEB1}, {0xEB4, 0xEBC}, {0xEC8, 0xECD}, {0xF18, 0xF19},
    {0xF35, 0xF35}, {0xF37, 0xF37}, {0xF39, 0xF39}, {0xF71, 0xF7E}, {0xF80, 0xF84}, {0xF86, 0xF87},
    {0xF8D, 0xFBC}, {0xFC6, 0xFC6}, {0x102D, 0x1030}, {0x1032, 0x1037}, {0x1039, 0x103A},
    {0x103D, 0x103E}, {0x1058, 0x1059}, {0x105E, 0x1060}, {0x1071, 0x1074}, {0x1082, 0x1082},
    {0x1085, 0x1086}, {0x108D, 0x108D}, {0x109D, 0x109D}, {0x135D, 0x135F}, {0x1712, 0x1714},
    {0x1732, 0x1733}, {0x1752, 0x1753}, {0x1772, 0x1773}, {0x17B4, 0x17B5}, {0x17B7, 0x17BD},
    {0x17C6, 0x17C6}, {0x17C9, 0x17D3}, {0x17DD, 0x17DD}, {0x180B, 0x180D}, {0x180F, 0x180F},
    {0x1885, 0x1886}, {0x18A9, 0x18A9}, {0x1920, 0x1922}, {0x1927, 0x1928}, {0x1932, 0x1932},
    {0x1939, 0x193B}, {0x1A17, 0x1A18}, {0x1A1B, 0x1A1B}, {0x1A56, 0x1A56}, {0x1A58, 0x1A60},
    {0x1A62, 0x1A62}, {0x1A65, 0x1A6C}, {0x1A73, 0x1A7F}, {0x1AB0, 0x1ABD}, {0x1ABF, 0x1B03},
    {0x1B34, 0x1B34}, {0x1B36, 0x1B3A}, {0x1B3C, 0x1B3C}, {0x1B42, 0x1B42}, {0x1B6B, 0x1B73},
    {0x1B80, 0x1B81}, {0x1BA2, 0x1BA5}, {0x1BA8, 0x1BA9}, {0x1BAB, 0x1BAD}, {0x1BE6, 0x1BE6},
    {0x1BE8, 0x1BE9}, {0x1BED, 0x1BED}, {0x1BEF, 0x1BF1}, {0x1C2C, 0x1C33}, {0x1C36, 0x1C37},
    {0x1CD0, 0x1CD2}, {0x1CD4, 0x1CE0}, {0x1CE2, 0x1CE8}, {0x1CED, 0x1CED}, {0x1CF4, 0x1CF4},
    {0x1CF8, 0x1CF9}, {0x1DC0, 0x1DFF}, {0x20D0, 0x20DC}, {0x20E1, 0x20E1}, {0x20E5, 0x20F0},
    {0x2CEF, 0x2CF1}, {0x2D7F, 0x2D7F}, {0x2DE0, 0x2DFF}, {0x302A, 0x302D}, {0x3099, 0x309A},
    {0xA66F, 0xA66F}, {0xA674, 0xA67D}, {0xA69E, 0xA69F}, {0xA6F0, 0xA6F1}, {0xA802, 0xA802},
    {0xA806, 0xA806}, {0xA80B, 0xA80B}, {0xA825, 0xA826}, {0xA82C, 0xA82C}, {0xA8C4, 0xA8C5},
    {0xA8E0, 0xA8F1}, {0xA8FF, 0xA8FF}, {0xA926, 0xA92D}, {0xA947, 0xA951}, {0xA980, 0xA982},
    {0xA9B3, 0xA9B3}, {0xA9B6, 0xA9B9}, {0xA9BC, 0xA9BD}, {0xA9E5, 0xA9E5}, {0xAA29, 0xAA2E},
    {0xAA31, 0xAA32}, {0xAA35, 0xAA36}, {0xAA43, 0xAA43}, {0xAA4C, 0xAA4C}, {0xAA7C, 0xAA7C},
    {0xAAB0, 0xAAB0}, {0xAAB2, 0xAAB4}, {0xAAB7, 0xAAB8}, {0xAABE, 0xAABF}, {0xAAC1, 0xAAC1},
    {0xAAEC, 0xAAED}, {0xAAF6, 0xAAF6}, {0xABE5, 0xABE5}, {0xABE8, 0xABE8}, {0xABED, 0xABED},
    {0xFB1E, 0xFB1E}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE2F}, {0x101FD, 0x101FD}, {0x102E0, 0x102E0},
    {0x10376, 0x1037A}, {0x10A01, 0x10A0F}, {0x10A38, 0x10A3F}, {0x10AE5, 0x10AE6},
    {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
    {0x11001, 0x11001}, {0x11038, 0x11046}, {0x11070, 0x11070}, {0x11073, 0x11074},
    {0x1107F, 0x11081}, {0x110B3, 0x110B6}, {0x110B9, 0x110BA}, {0x110C2, 0x110C2},
    {0x11100, 0x11102}, {0x11127, 0x1112B}, {0x1112D, 0x11134}, {0x11173, 0x11173},
    {0x11180, 0x11181}, {0x111B6, 0x111BE}, {0x111C9, 0x111CC}, {0x111CF, 0x111CF},
    {0x1122F, 0x11231}, {0x11234, 0x11234}, {0x11236, 0x11237}, {0x1123E, 0x1123E},
    {0x112DF, 0x112DF}, {0x112E3, 0x112EA}, {0x11300, 0x11301}, {0x1133B, 0x1133C},
    {0x11340, 0x11340}, {0x11366, 0x11374}, {0x11438, 0x1143F}, {0x11442, 0x11444},
    {0x11446, 0x11446}, {0x1145E, 0x1145E}, {0x114B3, 0x114B8}, {0x114BA, 0x114BA},
    {0x114BF, 0x114C0}, {0x114C2, 0x114C3}, {0x115B2, 0x115B5}, {0x115BC, 0x115BD},
    {0x115BF, 0x115C0}, {0x115DC, 0x115DD}, {0x11633, 0x1163A}, {0x1163D, 0x1163D},
    {0x1163F, 0x11640}, {0x116AB, 0x116AB}, {0x116AD, 0x116AD}, {0x116B0, 0x116B5},
    {0x116B7, 0x116B7}, {0x1171D, 0x1171F}, {0x11722, 0x11725}, {0x11727, 0x1172B},
    {0x1182F, 0x11837}, {0x11839, 0x1183A}, {0x1193B, 0x1193C}, {0x1193E, 0x1193E},
    {0x11943, 0x11943}, {0x119D4, 0x119DB}, {0x119E0, 0x119E0}, {0x11A01, 0x11A0A},
    {0x11A33, 0x11A38}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47}, {0x11A51, 0x11A56},
    {0x11A59, 0x11A5B}, {0x11A8A, 0x11A96}, {0x11A98, 0x11A99}, {0x11C30, 0x11C3D},
    {0x11C3F, 0x11C3F}, {0x11C92, 0x11CA7}, {0x11CAA, 0x11CB0}, {0x11CB2, 0x11CB3},
    {0x11CB5, 0x11CB6}, {0x11D31, 0x11D45}, {0x11D47, 0x11D47}, {0x11D90, 0x11D91},
    {0x11D95, 0x11D95}, {0x11D97, 0x11D97}, {0x11EF3, 0x11EF4}, {0x16AF0, 0x16AF4},
    {0x16B30, 0x16B36}, {0x16F4F, 0x16F4F}, {0x16F8F, 0x16F92}, {0x16FE4, 0x16FE4},
    {0x1BC9D, 0x1BC9E}, {0x1CF00, 0x1CF46}, {0x1D167, 0x1D169}, {0x1D17B, 0x1D182},
    {0x1D185, 0x1D18B}, {0x1D1AA, 0x1D1AD}, {0x1D242, 0x1D244}, {0x1DA00, 0x1DA36},
    {0x1DA3B, 0x1DA6C}, {0x1DA75, 0x1DA75}, {0x1DA84, 0x1DA84}, {0x1DA9B, 0x1DAAF},
    {0x1E000, 0x1E02A}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E8D0, 0x1E8D6}, {0x1E944, 0x1E94A}, {0xE0100, 0xE01EF},
};
constexpr CodeRange kPunctuationRanges[] = {
    {0x21, 0x23}, {0x25, 0x2A}, {0x2C, 0x2F}, {0x3A, 0x3B}, {0x3F, 0x40}, {0x5B, 0x5D},
    {0x5F, 0x5F}, {0x7B, 0x7B}, {0x7D, 0x7D}, {0xA1, 0xA1}, {0xA7, 0xA7}, {0xAB, 0xAB},
    {0xB6, 0xB7}, {0xBB, 0xBB}, {0xBF, 0xBF}, {0x37E, 0x37E}, {0x387, 0x387}, {0x55A, 0x55F},
    {0x589, 0x58A}, {0x5BE, 0x5BE}, {0x5C0, 0x5C0}, {0x5C3, 0x5C3}, {0x5C6, 0x5C6}, {0x5F3, 0x5F4},
    {0x609, 0x60A}, {0x60C, 0x60D}, {0x61B, 0x61B}, {0x61D, 0x61F}, {0x66A, 0x66D}, {0x6D4, 0x6D4},
    {0x700, 0x70D}, {0x7F7, 0x7F9}, {0x830, 0x83E}, {0x85E, 0x85E}, {0x964, 0x965}, {0x970, 0x970},
    {0x9FD, 0x9FD}, {0xA76, 0xA76}, {0xAF0, 0xAF0}, {0xC77, 0xC77}, {0xC84, 0xC84}, {0xDF4, 0xDF4},
    {0xE4F, 0xE4F}, {0xE5A, 0xE5B}, {0xF04, 0xF12}, {0xF14, 0xF14}, {0xF3A, 0xF3D}, {0xF85, 0xF85},
    {0xFD0, 0xFD4}, {0xFD9, 0xFDA}, {0x104A, 0x104F}, {0x10FB, 0x10FB}, {0x1360, 0x1368},
    {0x1400, 0x1400}, {0x166E, 0x166E}, {0x169B, 0x169C}, {0x16EB, 0x16ED}, {0x1735, 0x1736},
    {0x17D4, 0x17D6}, {0x17D8, 0x17DA}, {0x1800, 0x180A}, {0x1944, 0x1945}, {0x1A1E, 0x1A1F},
    {0x1AA0, 0x1AA6}, {0x1AA8, 0x1AAD}, {0x1B5A, 0x1B60}, {0x1B7D, 0x1B7E}, {0x1BFC, 0x1BFF},
    {0x1C3B, 0x1C3F}, {0x1C7E, 0x1C7F}, {0x1CC0, 0x1CC7}, {0x1CD3, 0x1CD3}, {0x2010, 0x2027},
    {0x2030, 0x2043}, {0x2045, 0x2051}, {0x2053, 0x205E}, {0x207D, 0x207E}, {0x208D, 0x208E},
    {0x2308, 0x230B}, {0x2329, 0x232A}, {0x2768, 0x2775}, {0x27C5, 0x27C6}, {0x27E6, 0x27EF},
    {0x2983, 0x2998}, {0x29D8, 0x29DB}, {0x29FC, 0x29FD}, {0x2CF9, 0x2CFC}, {0x2CFE, 0x2CFF},
    {0x2D70, 0x2D70}, {0x2E00, 0x2E2E}, {0x2E30, 0x2E4F}, {0x2E52, 0x2E5D}, {0x3001, 0x3003},
    {0x3008, 0x3011}, {0x3014, 0x301F}, {0x3030, 0x3030}, {0x303D, 0x303D}, {0x30A0, 0x30A0},
    {0x30FB, 0x30FB}, {0xA4FE, 0xA4FF}, {0xA60D, 0xA60F}, {0xA673, 0xA673}, {0xA67E, 0xA67E},
    {0xA6F2, 0xA6F7}, {0xA874, 0xA877}, {0xA8CE, 0xA8CF}, {0xA8F8, 0xA8FA}, {0xA8FC, 0xA8FC},
    {0xA92E, 0xA92F}, {0xA95F, 0xA95F}, {0xA9C1, 0xA9CD}, {0xA9DE, 0xA9DF}, {0xAA5C, 0xAA5F},
    {0xAADE, 0xAADF}, {0xAAF0, 0xAAF1}, {0xABEB, 0xABEB}, {0xFD3E, 0xFD3F}, {0xFE10, 0xFE19},
    {0xFE30, 0xFE61}, {0xFE63, 0xFE63}, {0xFE68, 0xFE68}, {0xFE6A, 0xFE6B}, {0xFF01, 0xFF03},
    {0xFF05, 0xFF0A}, {0xFF0C, 0xFF0F}, {0xFF1A, 0xFF1B}, {0xFF1F, 0xFF20}, {0xFF3B, 0xFF3D},
    {0xFF3F, 0xFF3F}, {0xFF5B, 0xFF5B}, {0xFF5D, 0xFF5D}, {0xFF5F, 0xFF65}, {0x10100, 0x10102},
    {0x1039F, 0x1039F}, {0x103D0, 0x103D0}, {0x1056F, 0x1056F}, {0x10857, 0x10857},
    {0x1091F, 0x1091F}, {0x1093F, 0x1093F}, {0x10A50, 0x10A58}, {0x10A7F, 0x10A7F},
    {0x10AF0, 0x10AF6}, {0x10B39, 0x10B3F}, {0x10B99, 0x10B9C}, {0x10EAD, 0x10EAD},
    {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x11047, 0x1104D}, {0x110BB, 0x110BC},
    {0x110BE, 0x110C1}, {0x11140, 0x11143}, {0x11174, 0x11175}, {0x111C5, 0x111C8},
    {0x111CD, 0x111CD}, {0x111DB, 0x111DB}, {0x111DD, 0x111DF}, {0x11238, 0x1123D},
    {0x112A9, 0x112A9}, {0x1144B, 0x1144F}, {0x1145A, 0x1145D}, {0x114C6, 0x114C6},
    {0x115C1, 0x115D7}, {0x11641, 0x11643}, {0x11660, 0x1166C}, {0x116B9, 0x116B9},
    {0x1173C, 0x1173E}, {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2},
    {0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C}, {0x11A9E, 0x11AA2}, {0x11C41, 0x11C45},
    {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8}, {0x11FFF, 0x11FFF}, {0x12470, 0x12474},
    {0x12FF1, 0x12FF2}, {0x16A6E, 0x16A6F}, {0x16AF5, 0x16AF5}, {0x16B37, 0x16B3B},
    {0x16B44, 0x16B44}, {0x16E97, 0x16E9A}, {0x16FE2, 0x16FE2}, {0x1BC9F, 0x1BC9F},
    {0x1DA87, 0x1DA8B}, {0x1E95E, 0x1E95F},
};
constexpr CodeRange kFormatRanges[] = {
    {0xAD, 0xAD}, {0x600, 0x605}, {0x61C, 0x61C}, {0x6DD, 0x6DD}, {0x70F, 0x70F}, {0x890, 0x891},
    {0x8E2, 0x8E2}, {0x180E, 0x180E}, {0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x206F},
    {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x13438},
    {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE007F},
};
constexpr CaseRange kLowerRanges[] = {
    {0x41, 0x5A, 1, 32}, {0xC0, 0xD6, 1, 32}, {0xD8, 0xDE, 1, 32}, {0x100, 0x12E, 2, 1},
    {0x132, 0x136, 2, 1}, {0x139, 0x147, 2, 1}, {0x14A, 0x176, 2, 1}, {0x178, 0x178, 1, -121},
    {0x179, 0x17D, 2, 1}, {0x181, 0x181, 1, 210}, {0x182, 0x184, 2, 1}, {0x186, 0x186, 1, 206},
    {0x187, 0x187, 1, 1}, {0x189, 0x18A, 1, 205}, {0x18B, 0x18B, 1, 1}, {0x18E, 0x18E, 1, 79},
    {0x18F, 0x18F, 1, 202}, {0x190, 0x190, 1, 203}, {0x191, 0x191, 1, 1}, {0x193, 0x193, 1, 205},
    {0x194, 0x194, 1, 207}, {0x196, 0x196, 1, 211}, {0x197, 0x197, 1, 209}, {0x198, 0x198, 1, 1},
    {0x19C, 0x19C, 1, 211}, {0x19D, 0x19D, 1, 213}, {0x19F, 0x19F, 1, 214}, {0x1A0, 0x1A4, 2, 1},
    {0x1A6, 0x1A6, 1, 218}, {0x1A7, 0x1A7, 1, 1}, {0x1A9, 0x1A9, 1, 218}, {0x1AC, 0x1AC, 1, 1},
    {0x1AE, 0x1AE, 1, 218}, {0x1AF, 0x1AF, 1, 1}, {0x1B1, 0x1B2, 1, 217}, {0x1B3, 0x1B5, 2, 1},
    {0x1B7, 0x1B7, 1, 219}, {0x1B8, 0x1B8, 1, 1}, {0x1BC, 0x1BC, 1, 1}, {0x1C4, 0x1C4, 1, 2},
    {0x1C5, 0x1C5, 1, 1}, {0x1C7, 0x1C7, 1, 2}, {0x1C8, 0x1C8, 1, 1}, {0x1CA, 0x1CA, 1, 2},
    {0x1CB, 0x1DB, 2, 1}, {0x1DE, 0x1EE, 2, 1}, {0x1F1, 0x1F1, 1, 2}, {0x1F2, 0x1F4, 2, 1},
    {0x1F6, 0x1F6, 1, -97}, {0x1F7, 0x1F7, 1, -56}, {0x1F8, 0x21E, 2, 1}, {0x220, 0x220, 1, -130},
    {0x222, 0x232, 2, 1}, {0x23A, 0x23A, 1, 10795}, {0x23B, 0x23B, 1, 1}, {0x23D, 0x23D, 1, -163},
    {0x23E, 0x23E, 1, 10792}, {0x241, 0x241, 1, 1}, {0x243, 0x243, 1, -195}, {0x244, 0x244, 1, 69},
    {0x245, 0x245, 1, 71}, {0x246, 0x24E, 2, 1}, {0x370, 0x372, 2, 1}, {0x376, 0x376, 1, 1},
    {0x37F, 0x37F, 1, 116}, {0x386, 0x386, 1, 38}, {0x388, 0x38A, 1, 37}, {0x38C, 0x38C, 1, 64},
    {0x38E, 0x38F, 1, 63}, {0x391, 0x3A1, 1, 32}, {0x3A3, 0x3AB, 1, 32}, {0x3CF, 0x3CF, 1, 8},
    {0x3D8, 0x3EE, 2, 1}, {0x3F4, 0x3F4, 1, -60}, {0x3F7, 0x3F7, 1, 1}, {0x3F9, 0x3F9, 1, -7},
    {0x3FA, 0x3FA, 1, 1}, {0x3FD, 0x3FF, 1, -130}, {0x400, 0x40F, 1, 80}, {0x410, 0x42F, 1, 32},
    {0x460, 0x480, 2, 1}, {0x48A, 0x4BE, 2, 1}, {0x4C0, 0x4C0, 1, 15}, {0x4C1, 0x4CD, 2, 1},
    {0x4D0, 0x52E, 2, 1}, {0x531, 0x556, 1, 48}, {0x10A0, 0x10C5, 1, 7264},
    {0x10C7, 0x10C7, 1, 7264}, {0x10CD, 0x10CD, 1, 7264}, {0x13A0, 0x13EF, 1, 38864},
    {0x13F0, 0x13F5, 1, 8}, {0x1C90, 0x1CBA, 1, -3008}, {0x1CBD, 0x1CBF, 1, -3008},
    {0x1E00, 0x1E94, 2, 1}, {0x1E9E, 0x1E9E, 1, -7615}, {0x1EA0, 0x1EFE, 2, 1},
    {0x1F08, 0x1F0F, 1, -8}, {0x1F18, 0x1F1D, 1, -8}, {0x1F28, 0x1F2F, 1, -8},
    {0x1F38, 0x1F3F, 1, -8}, {0x1F48, 0x1F4D, 1, -8}, {0x1F59, 0x1F5F, 2, -8},
    {0x1F68, 0x1F6F, 1, -8}, {0x1F88, 0x1F8F, 1, -8}, {0x1F98, 0x1F9F, 1, -8},
    {0x1FA8, 0x1FAF, 1, -8}, {0x1FB8, 0x1FB9, 1, -8}, {0x1FBA, 0x1FBB, 1, -74},
    {0x1FBC, 0x1FBC, 1, -9}, {0x1FC8, 0x1FCB, 1, -86}, {0x1FCC, 0x1FCC, 1, -9},
    {0x1FD8, 0x1FD9, 1, -8}, {0x1FDA, 0x1FDB, 1, -100}, {0x1FE8, 0x1FE9, 1, -8},
    {0x1FEA, 0x1FEB, 1, -112}, {0x1FEC, 0x1FEC, 1, -7}, {0x1FF8, 0x1FF9, 1, -128},
    {0x1FFA, 0x1FFB, 1, -126}, {0x1FFC, 0x1FFC, 1, -9}, {0x2126, 0x2126, 1, -7517},
    {0x212A, 0x212A, 1, -8383}, {0x212B, 0x212B, 1, -8262}, {0x2132, 0x2132, 1, 28},
    {0x2160, 0x216F, 1, 16}, {0x2183, 0x2183, 1, 1}, {0x24B6, 0x24CF, 1, 26},
    {0x2C00, 0x2C2F, 1, 48}, {0x2C60, 0x2C60, 1, 1}, {0x2C62, 0x2C62, 1, -10743},
    {0x2C63, 0x2C63, 1, -3814}, {0x2C64, 0x2C64, 1, -10727}, {0x2C67, 0x2C6B, 2, 1},
    {0x2C6D, 0x2C6D, 1, -10780}, {0x2C6E, 0x2C6E, 1, -10749}, {0x2C6F, 0x2C6F, 1, -10783},
    {0x2C70, 0x2C70, 1, -10782}, {0x2C72, 0x2C72, 1, 1}, {0x2C75, 0x2C75, 1, 1},
    {0x2C7E, 0x2C7F, 1, -10815}, {0x2C80, 0x2CE2, 2, 1}, {0x2CEB, 0x2CED, 2, 1},
    {0x2CF2, 0x2CF2, 1, 1}, {0xA640, 0xA66C, 2, 1}, {0xA680, 0xA69A, 2, 1}, {0xA722, 0xA72E, 2, 1},
    {0xA732, 0xA76E, 2, 1}, {0xA779, 0xA77B, 2, 1}, {0xA77D, 0xA77D, 1, -35332},
    {0xA77E, 0xA786, 2, 1}, {0xA78B, 0xA78B, 1, 1}, {0xA78D, 0xA78D, 1, -42280},
    {0xA790, 0xA792, 2, 1}, {0xA796, 0xA7A8, 2, 1}, {0xA7AA, 0xA7AA, 1, -42308},
    {0xA7AB, 0xA7AB, 1, -42319}, {0xA7AC, 0xA7AC, 1, -42315}, {0xA7AD, 0xA7AD, 1, -42305},
    {0xA7AE, 0xA7AE, 1, -42308}, {0xA7B0, 0xA7B0, 1, -42258}, {0xA7B1, 0xA7B1, 1, -42282},
    {0xA7B2, 0xA7B2, 1, -42261}, {0xA7B3, 0xA7B3, 1, 928}, {0xA7B4, 0xA7C2, 2, 1},
    {0xA7C4, 0xA7C4, 1, -48}, {0xA7C5, 0xA7C5, 1, -42307}, {0xA7C6, 0xA7C6, 1, -35384},
    {0xA7C7, 0xA7C9, 2, 1}, {0xA7D0, 0xA7D0, 1, 1}, {0xA7D6, 0xA7D8, 2, 1}, {0xA7F5, 0xA7F5, 1, 1},
    {0xFF21, 0xFF3A, 1, 32}, {0x10400, 0x10427, 1, 40}, {0x104B0, 0x104D3, 1, 40},
    {0x10570, 0x1057A, 1, 39}, {0x1057C, 0x1058A, 1, 39}, {0x1058C, 0x10592, 1, 39},
    {0x10594, 0x10595, 1, 39}, {0x10C80, 0x10CB2, 1, 64}, {0x118A0, 0x118BF, 1, 32},
    {0x16E40, 0x16E5F, 1, 32}, {0x1E900, 0x1E921, 1, 34},
};
constexpr DecompositionBlock kDecompositionBlocks[] = {
    {0xC0, 0x233,
     U"AAAAAA.CEEEEIIII.NOOOOO..UUUUY..aaaaaa.ceeeeiiii.nooooo..uuuuy.y"
     U"AaAaAaCcCcCcCcDd..EeEeEeEeEeGgGgGgGgHh..IiIiIiIiI...JjKk.LlLlLl."
     U"...NnNnNn...OoOoOo..RrRrRrSsSsSsSsTtTt..UuUuUuUuUuUuWwYyYZzZzZz."
     U"................................Oo.............Uu..............."
     U".............AaIiOoUuUuUuUuUu.AaAaÆæ..GgKkOoOoƷʒj...Gg..NnAaÆæØø"
     U"AaAaEeEeIiIiOoOoRrRrUuUuSsTt..Hh......AaEeOoOoOoOoYy"},
    {0x374, 0x3D4,
     U"ʹ.........;......\u00A8Α\u00B7ΕΗΙ.Ο.ΥΩι.........................ΙΥαεηιυ..."
     U"......................ιυουω....ϒϒ"},
    {0x400, 0x4F9,
     U"ЕЕ.Г...І....КИУ..........И...............................и......"
     U"................ее.г...і....киу.......................Ѵѵ........"
     U"................................................................"
     U".Жж.............АаАа..Ее..ӘәЖжЗз..ИиИиОо..ӨөЭэУуУуУуЧч..Ыы"},
    {0x1E00, 0x1FFD,
     U"AaBbBbBbCcDdDdDdDdDdEeEeEeEeEeFfGgHhHhHhHhHhIiIiKkKkKkLlLlLlLlMm"
     U"MmMmNnNnNnNnOoOoOoOoPpPpRrRrRrRrSsSsSsSsSsTtTtTtTtUuUuUuUuUuVvVv"
     U"WwWwWwWwWwXxXxYyZzZzZzhtwy.ſ....AaAaAaAaAaAaAaAaAaAaAaAaEeEeEeEe"
     U"EeEeEeEeIiIiOoOoOoOoOoOoOoOoOoOoOoOoUuUuUuUuUuUuUuYyYyYyYy......"
     U"ααααααααΑΑΑΑΑΑΑΑεεεεεε..ΕΕΕΕΕΕ..ηηηηηηηηΗΗΗΗΗΗΗΗιιιιιιιιΙΙΙΙΙΙΙΙ"
     U"οοοοοο..ΟΟΟΟΟΟ..υυυυυυυυ.Υ.Υ.Υ.ΥωωωωωωωωΩΩΩΩΩΩΩΩααεεηηιιοουυωω.."
     U"ααααααααΑΑΑΑΑΑΑΑηηηηηηηηΗΗΗΗΗΗΗΗωωωωωωωωΩΩΩΩΩΩΩΩααααα.ααΑΑΑΑΑ.ι."
     U".\u00A8ηηη.ηηΕΕΗΗΗ\u1FBF\u1FBF\u1FBFιιιι..ιιΙΙΙΙ.\u1FFE\u1FFE\u1FFEυυυυρρυυΥΥΥΥΡ\u00A8\u00A8`..ωωω.ωωΟΟΩΩΩ\u00B4"},
    {0x304C, 0x30FE,
     U"か.き.く.け.こ.さ.し.す.せ.そ.た.ち..つ.て.と......はは.ひ"
     U"ひ.ふふ.へへ.ほほ......................う......."
     U"..ゝ.............カ.キ.ク.ケ.コ.サ.シ.ス.セ.ソ.タ.チ."
     U".ツ.テ.ト......ハハ.ヒヒ.フフ.ヘヘ.ホホ.............."
     U"........ウ..ワヰヱヲ...ヽ"},
    {0xF900, 0xFAD9,
     U"豈更車賈滑串句龜龜契金喇奈懶癩羅蘿螺裸邏樂洛烙珞落酪駱亂卵欄爛蘭鸞嵐濫藍襤拉臘蠟"
     U"廊朗浪狼郎來冷勞擄櫓爐盧老蘆虜路露魯鷺碌祿綠菉錄鹿論壟弄籠聾牢磊賂雷壘屢樓淚漏累"
     U"縷陋勒肋凜凌稜綾菱陵讀拏樂諾丹寧怒率異北磻便復不泌數索參塞省葉說殺辰沈拾若掠略亮"
     U"兩凉梁糧良諒量勵呂女廬旅濾礪閭驪麗黎力曆歷轢年憐戀撚漣煉璉秊練聯輦蓮連鍊列劣咽烈"
     U"裂說廉念捻殮簾獵令囹寧嶺怜玲瑩羚聆鈴零靈領例禮醴隸惡了僚寮尿料樂燎療蓼遼龍暈阮劉"
     U"杻柳流溜琉留硫紐類六戮陸倫崙淪輪律慄栗率隆利吏履易李梨泥理痢罹裏裡里離匿溺吝燐璘"
     U"藺隣鱗麟林淋臨立笠粒狀炙識什茶刺切度拓糖宅洞暴輻行降見廓兀嗀..塚.晴..凞猪益"
     U"礼神祥福靖精羽.蘒.諸..逸都...飯飼館鶴郞隷侮僧免勉勤卑喝嘆器塀墨層屮悔慨憎"
     U"懲敏既暑梅海渚漢煮爫琢碑社祉祈祐祖祝禍禎穀突節練縉繁署者臭艹艹著褐視謁謹賓贈辶逸"
     U"難響頻恵𤋮舘..並况全侀充冀勇勺喝啕喙嗢塚墳奄奔婢嬨廒廙彩徭惘慎愈憎慠懲戴揄搜摒"
     U"敖晴朗望杖歹殺流滛滋漢瀞煮瞧爵犯猪瑱甆画瘝瘟益盛直睊着磌窱節类絛練缾者荒華蝹襁覆"
     U"視調諸請謁諾諭謹變贈輸遲醙鉶陼難靖韛響頋頻鬒龜𢡊𢡄𣏕㮝䀘䀹𥉉𥳐𧻓齃龎"},
    {0x2F800, 0x2FA1D,
     U"丽丸乁𠄢你侮侻倂偺備僧像㒞𠘺免兔兤具𠔜㒹內再𠕋冗冤仌冬况𩇟凵刃㓟刻剆割剷㔕勇勉勤"
     U"勺包匆北卉卑博即卽卿卿卿𠨬灰及叟𠭣叫叱吆咞吸呈周咢哶唐啓啣善善喙喫喳嗂圖嘆圗噑噴"
     U"切壮城埴堍型堲報墬𡓤売壷夆多夢奢𡚨𡛪姬娛娧姘婦㛮㛼嬈嬾嬾𡧈寃寘寧寳𡬘寿将当尢㞁屠"
     U"屮峀岍𡷤嵃𡷦嵮嵫嵼巡巢㠯巽帨帽幩㡢𢆃㡼庰庳庶廊𪎒廾𢌱𢌱舁弢弢㣇𣊸𦇚形彫㣣徚忍志忹"
     U"悁㤺㤜悔𢛔惇慈慌慎慌慺憎憲憤憯懞懲懶成戛扝抱拔捐𢬌挽拼捨掃揤𢯱搢揅掩㨮摩摾撝摷㩬"
     U"敏敬𣀊旣書晉㬙暑㬈㫤冒冕最暜肭䏙朗望朡杞杓𣏃㭉柺枅桒梅𣑭梎栟椔㮝楂榣槪檨𣚣櫛㰘次"
     U"𣢧歔㱎歲殟殺殻𣪍𡴋𣫺汎𣲼沿泍汧洖派海流浩浸涅𣴞洴港湮㴳滋滇𣻑淹潮𣽞𣾎濆瀹瀞瀛㶖灊"
     U"災灷炭𠔥煅𤉣熜𤎫爨爵牐𤘈犀犕𤜵𤠔獺王㺬玥㺸㺸瑇瑜瑱璅瓊㼛甤𤰶甾𤲒異𢆟瘐𤾡𤾸𥁄㿼䀈"
     U"直𥃳𥃲𥄙𥄳眞真真睊䀹瞋䁆䂖𥐝硎碌磌䃣𥘦祖𥚚𥛅福秫䄯穀穊穏𥥼𥪧𥪧竮䈂𥮫篆築䈧𥲀糒䊠"
     U"糨糣紀𥾆絣䌁緇縂繅䌴𦈨𦉇䍙𦋙罺𦌾羕翺者𦓚𦔣聠𦖨聰𣍟䏕育脃䐋脾媵𦞧𦞵𣎓𣎜舁舄辞䑫芑"
     U"芋芝劳花芳芽苦𦬼若茝荣莭茣莽菧著荓菊菌菜𦰶𦵫𦳕䔫蓱蓳蔖𧏊蕤𦼬䕝䕡𦾱𧃒䕫虐虜虧虩蚩"
     U"蚈蜎蛢蝹蜨蝫螆䗗蟡蠁䗹衠衣𧙧裗裞䘵裺㒻𧢮𧥦䚾䛇誠諭變豕𧲨貫賁贛起𧼯𠠄跋趼跰𠣞軔輸"
     U"𨗒𨗭邔郱鄑𨜮鄛鈸鋗鋘鉼鏹鐕𨯺開䦕閷𨵷䧦雃嶲霣𩅅𩈚䩮䩶韠𩐊䪲𩒖頋頋頩𩖶飢䬳餩馧駂駾"
     U"䯎𩬰鬒鱀鳽䳎䳭鵧𪃎䳸𪄅𪈎𪊑麻䵖黹黾鼅鼏鼖鼻𪘀"},
};
constexpr CodePair kDecompositionPairs[] = {
    {0x622, 0x627}, {0x623, 0x627}, {0x624, 0x648}, {0x625, 0x627}, {0x626, 0x64A}, {0x6C0, 0x6D5},
    {0x6C2, 0x6C1}, {0x6D3, 0x6D2}, {0x929, 0x928}, {0x931, 0x930}, {0x934, 0x933}, {0x958, 0x915},
    {0x959, 0x916}, {0x95A, 0x917}, {0x95B, 0x91C}, {0x95C, 0x921}, {0x95D, 0x922}, {0x95E, 0x92B},
    {0x95F, 0x92F}, {0x9DC, 0x9A1}, {0x9DD, 0x9A2}, {0x9DF, 0x9AF}, {0xA33, 0xA32}, {0xA36, 0xA38},
    {0xA59, 0xA16}, {0xA5A, 0xA17}, {0xA5B, 0xA1C}, {0xA5E, 0xA2B}, {0xB48, 0xB47}, {0xB5C, 0xB21},
    {0xB5D, 0xB22}, {0xCC0, 0xCD5}, {0xCC7, 0xCD5}, {0xCC8, 0xCD6}, {0xCCA, 0xCC2}, {0xDDA, 0xDD9},
    {0xF43, 0xF42}, {0xF4D, 0xF4C}, {0xF52, 0xF51}, {0xF57, 0xF56}, {0xF5C, 0xF5B}, {0xF69, 0xF40},
    {0x1026, 0x1025}, {0x1B3B, 0x1B35}, {0x1B3D, 0x1B35}, {0x1B43, 0x1B35}, {0x2000, 0x2002},
    {0x2001, 0x2003}, {0x2126, 0x3A9}, {0x212A, 0x4B}, {0x212B, 0x41}, {0x219A, 0x2190},
    {0x219B, 0x2192}, {0x21AE, 0x2194}, {0x21CD, 0x21D0}, {0x21CE, 0x21D4}, {0x21CF, 0x21D2},
    {0x2204, 0x2203}, {0x2209, 0x2208}, {0x220C, 0x220B}, {0x2224, 0x2223}, {0x2226, 0x2225},
    {0x2241, 0x223C}, {0x2244, 0x2243}, {0x2247, 0x2245}, {0x2249, 0x2248}, {0x2260, 0x3D},
    {0x2262, 0x2261}, {0x226D, 0x224D}, {0x226E, 0x3C}, {0x226F, 0x3E}, {0x2270, 0x2264},
    {0x2271, 0x2265}, {0x2274, 0x2272}, {0x2275, 0x2273}, {0x2278, 0x2276}, {0x2279, 0x2277},
    {0x2280, 0x227A}, {0x2281, 0x227B}, {0x2284, 0x2282}, {0x2285, 0x2283}, {0x2288, 0x2286},
    {0x2289, 0x2287}, {0x22AC, 0x22A2}, {0x22AD, 0x22A8}, {0x22AE, 0x22A9}, {0x22AF, 0x22AB},
    {0x22E0, 0x227C}, {0x22E1, 0x227D}, {0x22E2, 0x2291}, {0x22E3, 0x2292}, {0x22EA, 0x22B2},
    {0x22EB, 0x22B3}, {0x22EC, 0x22B4}, {0x22ED, 0x22B5}, {0x2329, 0x3008}, {0x232A, 0x3009},
    {0x2ADC, 0x2ADD}, {0xFB1D, 0x5D9}, {0xFB1F, 0x5F2}, {0xFB2A, 0x5E9}, {0xFB2B, 0x5E9},
    {0xFB2C, 0x5E9}, {0xFB2D, 0x5E9}, {0xFB2E, 0x5D0}, {0xFB2F, 0x5D0}, {0xFB30, 0x5D0},
    {0xFB31, 0x5D1}, {0xFB32, 0x5D2}, {0xFB33, 0x5D3}, {0xFB34, 0x5D4}, {0xFB35, 0x5D5},
    {0xFB36, 0x5D6}, {0xFB38, 0x5D8}, {0xFB39, 0x5D9}, {0xFB3A, 0x5DA}, {0xFB3B, 0x5DB},
    {0xFB3C, 0x5DC}, {0xFB3E, 0x5DE}, {0xFB40, 0x5E0}, {0xFB41, 0x5E1}, {0xFB43, 0x5E3},
    {0xFB44, 0x5E4}, {0xFB46, 0x5E6}, {0xFB47, 0x5E7}, {0xFB48, 0x5E8}, {0xFB49, 0x5E9},
    {0xFB4A, 0x5EA}, {0xFB4B, 0x5D5}, {0xFB4C, 0x5D1}, {0xFB4D, 0x5DB}, {0xFB4E, 0x5E4},
    {0x1109A, 0x11099}, {0x1109C, 0x1109B}, {0x110AB, 0x110A5}, {0x114BB, 0x114B9},
};
constexpr CodeTriple kTwoPartDecompositions[] = {
    {0x9CB, 0x9C7, 0x9BE}, {0x9CC, 0x9C7, 0x9D7}, {0xB4B, 0xB47, 0xB3E}, {0xB4C, 0xB47, 0xB57},
    {0xB94, 0xB92, 0xBD7}, {0xBCA, 0xBC6, 0xBBE}, {0xBCB, 0xBC7, 0xBBE}, {0xBCC, 0xBC6, 0xBD7},
    {0xCCB, 0xCC2, 0xCD5}, {0xD4A, 0xD46, 0xD3E}, {0xD4B, 0xD47, 0xD3E}, {0xD4C, 0xD46, 0xD57},
    {0xDDC, 0xDD9, 0xDCF}, {0xDDD, 0xDD9, 0xDCF}, {0xDDE, 0xDD9, 0xDDF}, {0x1B06, 0x1B05, 0x1B35},
    {0x1B08, 0x1B07, 0x1B35}, {0x1B0A, 0x1B09, 0x1B35}, {0x1B0C, 0x1B0B, 0x1B35},
    {0x1B0E, 0x1B0D, 0x1B35}, {0x1B12, 0x1B11, 0x1B35}, {0x1B40, 0x1B3E, 0x1B35},
    {0x1B41, 0x1B3F, 0x1B35}, {0x1134B, 0x11347, 0x1133E}, {0x1134C, 0x11347, 0x11357},
    {0x114BC, 0x114B9, 0x114B0}, {0x114BE, 0x114B9, 0x114BD}, {0x115BA, 0x115B8, 0x115AF},
    {0x115BB, 0x115B9, 0x115AF}, {0x11938, 0x11935, 0x11930}, {0x1D15E, 0x1D157, 0x1D165},
    {0x1D15F, 0x1D158, 0x1D165}, {0x1D1BB, 0x1D1B9, 0x1D165}, {0x1D1BC, 0x1D1BA, 0x1D165},
};
// clang-format on

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t c) {
  const auto* it = std::upper_bound(std::begin(table), std::end(table), c,
                                    [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

constexpr char32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3;

// Hangul syllables decompose algorithmically into 2 or 3 conjoining jamo.
void append_hangul_jamo(char32_t c, std::u32string& out) {
  constexpr char32_t kLeadBase = 0x1100, kVowelBase = 0x1161, kTrailBase = 0x11A7;
  constexpr char32_t kVowels = 21, kTrails = 28;
  const char32_t index = c - kHangulFirst;
  out.push_back(kLeadBase + index / (kVowels * kTrails));
  out.push_back(kVowelBase + (index % (kVowels * kTrails)) / kTrails);
  if (index % kTrails != 0) out.push_back(kTrailBase + index % kTrails);
}

template <typename Entry, size_t N>
const Entry* find_entry(const Entry (&table)[N], char32_t c) {
  const auto* it =
      std::lower_bound(std::begin(table), std::end(table), c, [](const Entry& e, char32_t v) { return e.from < v; });
  return (it != std::end(table) && it->from == c) ? it : nullptr;
}

// What NFD leaves of `c` once nonspacing marks are dropped, when that is one
// code point; `c` itself otherwise.
char32_t stripped_base(char32_t c) {
  for (const DecompositionBlock& block : kDecompositionBlocks) {
    if (c >= block.first && c <= block.last) {
      const char32_t base = block.bases[c - block.first];
      return base == U'.' ? c : base;
    }
  }
  const CodePair* pair = find_entry(kDecompositionPairs, c);
  return pair ? pair->to : c;
}

}  // namespace

// ---- UTF-8 ----

Utf8Step next_utf8(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {b0, 1, true};
  size_t need = 0;
  char32_t cp = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // valid range of the next byte (excludes overlongs and surrogates)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0xFFFD, 1, false};
  }
  for (size_t i = 1; i <= need; ++i) {
    if (pos + i >= s.size()) return {0xFFFD, i, false};
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if (b < lo || b > hi) return {0xFFFD, i, false};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true};
}

core::Result<std::u32string> utf8_to_u32(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Step step = next_utf8(text, pos);
    if (!step.valid) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned>(static_cast<uint8_t>(text[pos])));
      return core::invalid_argument("text is not valid UTF-8 (byte " + std::string(byte) + " at offset " +
                                    std::to_string(pos) + ")");
    }
    out.push_back(step.cp);
    pos += step.len;
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string u32_to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const Utf8Step step = next_utf8(bytes, pos);
    if (step.valid) {
      out.append(bytes.substr(pos, step.len));
    } else {
      append_utf8(0xFFFD, out);
    }
    pos += step.len;
  }
  return out;
}

// ---- Unicode classes ----

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in_ranges(kLetterRanges, c);
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kNumberRanges, c);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return in_ranges(kPunctuationRanges, c);
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;  // BERT counts these as whitespace
  if (c < 0x20 || (c >= 0x7F && c <= 0x9F)) return true;
  const bool private_use = (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000;
  return private_use || in_ranges(kFormatRanges, c);
}

bool is_nonspacing_mark(char32_t c) { return c >= 0x300 && in_ranges(kNonspacingMarkRanges, c); }

bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_lowercase(char32_t c, std::u32string& out) {
  if (c == 0x130) {  // the one code point whose lowercase is two: i + combining dot above
    out.append(U"i\u0307");
    return;
  }
  const auto* it = std::upper_bound(std::begin(kLowerRanges), std::end(kLowerRanges), c,
                                    [](char32_t v, const CaseRange& r) { return v < r.first; });
  if (it != std::begin(kLowerRanges)) {
    const CaseRange& r = *std::prev(it);
    if (c <= r.last && (c - r.first) % r.stride == 0) c = static_cast<char32_t>(static_cast<int32_t>(c) + r.delta);
  }
  out.push_back(c);
}

void append_without_accents(char32_t c, std::u32string& out) {
  if (c >= kHangulFirst && c <= kHangulLast) {
    append_hangul_jamo(c, out);
  } else if (const CodeTriple* two = find_entry(kTwoPartDecompositions, c)) {
    out.push_back(two->first);  // two-part vowels: both halves are spacing marks
    out.push_back(two->second);
  } else if (!is_nonspacing_mark(c)) {
    out.push_back(stripped_base(c));
  }
}

// ---- Normalizer (BertNormalizer's steps, in its order) ----

namespace {

std::u32string clean_text(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    out.push_back(is_whitespace(c) ? U' ' : c);
  }
  return out;
}

std::u32string pad_chinese_chars(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (is_cjk_ideograph(c)) {
      out.push_back(U' ');
      out.push_back(c);
      out.push_back(U' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::u32string normalize(std::u32string_view text, const NormalizerConfig& cfg) {
  std::u32string out(text);
  if (cfg.clean_text) out = clean_text(out);
  if (cfg.handle_chinese_chars) out = pad_chinese_chars(out);
  if (cfg.strip_accents) {
    std::u32string stripped;
    for (char32_t c : out) append_without_accents(c, stripped);
    out.swap(stripped);
  }
  if (cfg.lowercase) {
    std::u32string lowered;
    for (char32_t c : out) append_lowercase(c, lowered);
    out.swap(lowered);
  }
  return out;
}

// ---- JSON helpers ----

namespace {

const Json* member(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return (it == obj.end() || it->is_null()) ? nullptr : &*it;
}

core::Status wrong_type(const char* key, const char* expected) {
  return core::parse_error(std::string("\"") + key + "\" must be " + expected);
}

}  // namespace

core::Result<bool> json_bool(const Json& obj, const char* key, bool fallback) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return wrong_type(key, "a boolean");
  return v->get<bool>();
}

core::Result<int64_t> json_int(const Json& obj, const char* key, int64_t fallback) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) return wrong_type(key, "an integer");
  return v->get<int64_t>();
}

core::Result<std::string> json_string(const Json& obj, const char* key, std::string fallback) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) return wrong_type(key, "a string");
  return v->get<std::string>();
}

core::Result<std::optional<std::string>> json_opt_string(const Json& obj, const char* key) {
  const Json* v = member(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return wrong_type(key, "a string");
  return std::optional<std::string>(v->get<std::string>());
}

std::optional<int64_t> Vocab::find(std::string_view token) const {
  const auto it = ids.find(token);
  if (it == ids.end()) return std::nullopt;
  return it->second;
}

void Vocab::add(const std::string& token, int64_t id) {
  ids.insert_or_assign(token, id);
  tokens.emplace(id, token);  // with duplicate ids the first spelling wins
}

core::Result<Vocab> vocab_from_json(const Json& obj, const std::string& where) {
  if (!obj.is_object()) return core::parse_error(where + " is not a JSON object of token -> id");
  constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;
  Vocab vocab;
  for (const auto& [token, id] : obj.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId) {
      return core::parse_error(where + ": token '" + token + "' has no valid id");
    }
    vocab.add(token, id.get<int64_t>());
  }
  return vocab;
}

// ---- tokenizer.json sections shared by all models ----

namespace {

core::Result<AddedToken> parse_added_token(const Json& j) {
  if (!j.is_object()) return core::parse_error("added_tokens entry is not an object");
  AddedToken t;
  TESSERA_ASSIGN_OR_RETURN(t.id, json_int(j, "id", -1));
  TESSERA_ASSIGN_OR_RETURN(t.content, json_string(j, "content", ""));
  if (t.id < 0 || t.content.empty()) return core::parse_error("added token needs an id and a content");
  TESSERA_ASSIGN_OR_RETURN(t.special, json_bool(j, "special", false));
  TESSERA_ASSIGN_OR_RETURN(t.single_word, json_bool(j, "single_word", false));
  TESSERA_ASSIGN_OR_RETURN(t.lstrip, json_bool(j, "lstrip", false));
  TESSERA_ASSIGN_OR_RETURN(t.rstrip, json_bool(j, "rstrip", false));
  TESSERA_ASSIGN_OR_RETURN(t.normalized, json_bool(j, "normalized", !t.special));  // HF's default
  return t;
}

core::Status parse_added_tokens(const Json& root, std::vector<AddedToken>& out) {
  const Json* list = member(root, "added_tokens");
  if (list == nullptr) return core::ok_status();
  if (!list->is_array()) return wrong_type("added_tokens", "an array");
  for (const Json& j : *list) {
    TESSERA_ASSIGN_OR_RETURN(AddedToken t, parse_added_token(j));
    out.push_back(std::move(t));
  }
  return core::ok_status();
}

core::Status parse_normalizer(const Json* j, NormalizerConfig& cfg) {
  if (j == nullptr) return core::ok_status();
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  if (type == "BertNormalizer") {
    TESSERA_ASSIGN_OR_RETURN(cfg.clean_text, json_bool(*j, "clean_text", true));
    TESSERA_ASSIGN_OR_RETURN(cfg.handle_chinese_chars, json_bool(*j, "handle_chinese_chars", true));
    TESSERA_ASSIGN_OR_RETURN(cfg.lowercase, json_bool(*j, "lowercase", true));
    // null strip_accents follows lowercase
    TESSERA_ASSIGN_OR_RETURN(cfg.strip_accents, json_bool(*j, "strip_accents", cfg.lowercase));
    return core::ok_status();
  }
  if (type == "Lowercase") {
    cfg.lowercase = true;
    return core::ok_status();
  }
  if (type == "Sequence") {
    const Json* list = member(*j, "normalizers");
    if (list == nullptr || !list->is_array()) return wrong_type("normalizers", "an array");
    for (const Json& item : *list) TESSERA_RETURN_IF_ERROR(parse_normalizer(&item, cfg));
    return core::ok_status();
  }
  return core::unimplemented("unsupported normalizer type '" + type + "'");
}

core::Result<std::vector<int64_t>> template_special_ids(const Json& specials, const std::string& name) {
  const Json* entry = member(specials, name.c_str());
  const Json* ids = entry ? member(*entry, "ids") : nullptr;
  if (ids == nullptr || !ids->is_array()) {
    return core::parse_error("template token '" + name + "' has no ids in special_tokens");
  }
  std::vector<int64_t> out;
  for (const Json& id : *ids) {
    if (!id.is_number_integer()) return core::parse_error("template token '" + name + "' has a non-integer id");
    out.push_back(id.get<int64_t>());
  }
  return out;
}

// TemplateProcessing's "single" list: special tokens around one sequence ($A).
core::Status parse_template(const Json& j, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix) {
  const Json* single = member(j, "single");
  if (single == nullptr || !single->is_array()) return wrong_type("single", "an array");
  const Json empty = Json::object();
  const Json* specials = member(j, "special_tokens");
  bool seen_sequence = false;
  for (const Json& piece : *single) {
    if (member(piece, "Sequence") != nullptr) {
      if (seen_sequence) return core::parse_error("template 'single' has more than one sequence");
      seen_sequence = true;
      continue;
    }
    const Json* special = member(piece, "SpecialToken");
    TESSERA_ASSIGN_OR_RETURN(std::string name, json_string(special ? *special : empty, "id", ""));
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> ids, template_special_ids(specials ? *specials : empty, name));
    std::vector<int64_t>& dst = seen_sequence ? suffix : prefix;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  if (!seen_sequence) return core::parse_error("template 'single' has no $A sequence");
  return core::ok_status();
}

// BertProcessing / RobertaProcessing: "cls": ["[CLS]", 101], "sep": ["[SEP]", 102].
core::Result<int64_t> processing_token_id(const Json& j, const char* key) {
  const Json* pair = member(j, key);
  if (pair == nullptr || !pair->is_array() || pair->size() != 2 || !(*pair)[1].is_number_integer()) {
    return wrong_type(key, "a [token, id] pair");
  }
  return (*pair)[1].get<int64_t>();
}

core::Status parse_post_processor(const Json* j, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix) {
  if (j == nullptr) return core::ok_status();
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  if (type == "ByteLevel") return core::ok_status();  // only trims offsets
  if (type == "TemplateProcessing") return parse_template(*j, prefix, suffix);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    TESSERA_ASSIGN_OR_RETURN(int64_t cls, processing_token_id(*j, "cls"));
    TESSERA_ASSIGN_OR_RETURN(int64_t sep, processing_token_id(*j, "sep"));
    prefix.insert(prefix.begin(), cls);
    suffix.push_back(sep);
    return core::ok_status();
  }
  if (type == "Sequence") {
    const Json* list = member(*j, "processors");
    if (list == nullptr || !list->is_array()) return wrong_type("processors", "an array");
    for (const Json& item : *list) {
      std::vector<int64_t> p, s;  // each processor wraps what the previous ones produced
      TESSERA_RETURN_IF_ERROR(parse_post_processor(&item, p, s));
      prefix.insert(prefix.begin(), p.begin(), p.end());
      suffix.insert(suffix.end(), s.begin(), s.end());
    }
    return core::ok_status();
  }
  return core::unimplemented("unsupported post_processor type '" + type + "'");
}

core::Status parse_decoder(const Json* j, DecoderConfig& cfg) {
  if (j == nullptr) return core::ok_status();
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  if (type == "WordPiece") {
    cfg.kind = DecoderKind::kWordPiece;
    TESSERA_ASSIGN_OR_RETURN(cfg.prefix, json_string(*j, "prefix", "##"));
    TESSERA_ASSIGN_OR_RETURN(cfg.cleanup, json_bool(*j, "cleanup", true));
    return core::ok_status();
  }
  if (type == "ByteLevel") {
    cfg.kind = DecoderKind::kByteLevel;
    return core::ok_status();
  }
  return core::unimplemented("unsupported decoder type '" + type + "'");
}

}  // namespace

core::Status parse_common(const Json& root, TokenizerParts& parts) {
  TESSERA_RETURN_IF_ERROR(parse_added_tokens(root, parts.added));
  TESSERA_RETURN_IF_ERROR(parse_normalizer(member(root, "normalizer"), parts.normalizer));
  TESSERA_RETURN_IF_ERROR(
      parse_post_processor(member(root, "post_processor"), parts.template_prefix, parts.template_suffix));
  return parse_decoder(member(root, "decoder"), parts.decoder);
}

// ---- TokenizerBase ----

TokenizerBase::TokenizerBase(TokenizerParts parts) : parts_(std::move(parts)) {
  for (size_t i = 0; i < parts_.added.size(); ++i) {
    const AddedToken& t = parts_.added[i];
    added_vocab_.add(t.content, t.id);
    if (t.special) special_ids_.insert(t.id);
    auto decoded = utf8_to_u32(t.content);  // JSON strings are valid UTF-8; skip the token otherwise
    std::u32string text = decoded.ok() ? std::move(decoded).value() : std::u32string();
    // Normalized tokens are matched in normalized text, so they are normalized too (as HF does).
    if (t.normalized) text = normalize(text, parts_.normalizer);
    if (!text.empty()) (t.normalized ? normalized_index_ : raw_index_)[text[0]].push_back(i);
    match_text_.push_back(std::move(text));
  }
  for (auto* index : {&raw_index_, &normalized_index_}) {
    for (auto& [first, list] : *index) {
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return match_text_[a].size() > match_text_[b].size(); });
    }
  }
}

std::optional<size_t> TokenizerBase::longest_added_at(std::u32string_view text, size_t pos, bool normalized) const {
  const auto& index = normalized ? normalized_index_ : raw_index_;
  const auto it = index.find(text[pos]);
  if (it == index.end()) return std::nullopt;
  for (size_t i : it->second) {
    if (text.substr(pos).starts_with(match_text_[i])) return i;
  }
  return std::nullopt;
}

namespace {

bool is_word_char(char32_t c) { return is_letter(c) || is_number(c) || is_nonspacing_mark(c) || c == U'_'; }

// single_word tokens only match when not glued to letters or digits.
bool stands_alone(std::u32string_view text, size_t begin, size_t end) {
  return (begin == 0 || !is_word_char(text[begin - 1])) && (end == text.size() || !is_word_char(text[end]));
}

}  // namespace

// Leftmost-longest matching of added tokens, like HF's Aho-Corasick pass.
std::vector<TokenizerBase::Segment> TokenizerBase::split_added(std::u32string_view text, bool normalized) const {
  std::vector<Segment> out;
  size_t start = 0;  // first char not emitted yet
  for (size_t pos = 0; pos < text.size();) {
    const std::optional<size_t> hit = longest_added_at(text, pos, normalized);
    if (!hit) {
      ++pos;
      continue;
    }
    const AddedToken& token = parts_.added[*hit];
    size_t begin = pos, end = pos + match_text_[*hit].size();
    pos = end;
    if (token.single_word && !stands_alone(text, begin, end)) continue;
    while (token.lstrip && begin > start && is_whitespace(text[begin - 1])) --begin;
    while (token.rstrip && end < text.size() && is_whitespace(text[end])) ++end;
    if (begin > start) out.push_back({text.substr(start, begin - start), std::nullopt});
    out.push_back({text.substr(begin, end - begin), token.id});
    start = pos = end;
  }
  if (start < text.size()) out.push_back({text.substr(start), std::nullopt});
  return out;
}

core::Result<std::vector<int64_t>> TokenizerBase::encode(std::string_view text, bool add_special_tokens) const {
  TESSERA_ASSIGN_OR_RETURN(const std::u32string chars, utf8_to_u32(text));
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = parts_.template_prefix;
  for (const Segment& raw : split_added(chars, /*normalized=*/false)) {
    if (raw.id) {
      ids.push_back(*raw.id);
      continue;
    }
    const std::u32string normalized = normalize(raw.text, parts_.normalizer);
    for (const Segment& piece : split_added(normalized, /*normalized=*/true)) {
      if (piece.id) {
        ids.push_back(*piece.id);
      } else {
        TESSERA_RETURN_IF_ERROR(encode_piece(piece.text, ids));
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), parts_.template_suffix.begin(), parts_.template_suffix.end());
  return ids;
}

const std::string* TokenizerBase::find_token(int64_t id) const {
  if (const auto it = added_vocab_.tokens.find(id); it != added_vocab_.tokens.end()) return &it->second;
  if (const auto it = parts_.vocab.tokens.find(id); it != parts_.vocab.tokens.end()) return &it->second;
  return nullptr;
}

core::Result<std::vector<std::string>> TokenizerBase::id_to_tokens(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    const std::string* token = find_token(id);
    if (token == nullptr) return core::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(*token);
  }
  return tokens;
}

core::Result<std::string> TokenizerBase::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    const std::string* token = find_token(id);
    if (token == nullptr || (skip_special && special_ids_.contains(id))) continue;
    tokens.push_back(*token);
  }
  switch (parts_.decoder.kind) {
    case DecoderKind::kWordPiece:
      return decode_wordpiece(tokens, parts_.decoder.prefix, parts_.decoder.cleanup);
    case DecoderKind::kByteLevel:
      return decode_byte_level(tokens);
    case DecoderKind::kNone:
      break;
  }
  std::string out;  // no decoder: HF joins tokens with spaces
  for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  return out;
}

int64_t TokenizerBase::vocab_size() const {
  auto n = static_cast<int64_t>(parts_.vocab.ids.size());
  for (const auto& [token, id] : added_vocab_.ids) n += parts_.vocab.ids.contains(token) ? 0 : 1;
  return n;
}

std::optional<int64_t> TokenizerBase::token_to_id(std::string_view token) const {
  if (auto id = added_vocab_.find(token)) return id;
  return parts_.vocab.find(token);
}

}  // namespace tessera::model::tok

// ---- Loaders ----

namespace tessera::model {
namespace {

using tok::Json;

// Old tokenizer.json files may leave out model.type; HF infers it from the fields.
std::string infer_model_type(const Json& model) {
  if (model.contains("merges")) return "BPE";
  if (model.contains("max_input_chars_per_word") || model.contains("continuing_subword_prefix")) return "WordPiece";
  return "";
}

core::Result<std::unique_ptr<Tokenizer>> tokenizer_from_root(const Json& root) {
  if (!root.is_object()) return core::parse_error("top level is not a JSON object");
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return core::parse_error("missing \"model\" object");
  TESSERA_ASSIGN_OR_RETURN(std::string type, tok::json_string(*model, "type", ""));
  if (type.empty()) type = infer_model_type(*model);
  if (type == "WordPiece") return tok::wordpiece_from_json(root);
  if (type == "BPE") return tok::bpe_from_json(root);
  if (type.empty()) return core::parse_error("model has no \"type\"");
  return core::unimplemented("unsupported model type '" + type + "' (WordPiece and BPE are supported)");
}

}  // namespace

core::Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  try {
    const Json root = Json::parse(text);
    auto tokenizer = tokenizer_from_root(root);
    if (!tokenizer.ok()) return tokenizer.status().with_context(path);
    return tokenizer;
  } catch (const Json::exception& e) {  // malformed JSON; typed lookups above do not throw
    return core::parse_error(path + ": " + e.what());
  }
}

core::Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir) {
  const std::string json_path = dir + "/tokenizer.json";
  if (core::file_exists(json_path)) return load_tokenizer_json(json_path);
  if (core::file_exists(dir + "/vocab.txt")) return load_wordpiece_vocab_txt(dir + "/vocab.txt");
  if (core::file_exists(dir + "/vocab.json") && core::file_exists(dir + "/merges.txt")) {
    return load_bpe_vocab_merges(dir + "/vocab.json", dir + "/merges.txt");
  }
  return core::not_found("no tokenizer.json, vocab.txt or vocab.json + merges.txt in '" + dir + "'");
}

}  // namespace tessera::model
