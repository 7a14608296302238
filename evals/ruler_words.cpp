// The word lists of the RULER tasks (ruler_words.h).
#include "evals/ruler_words.h"

namespace kvlab {

const std::vector<std::string> kRulerAdjectives = {
    "able", "acid", "active", "actual", "afraid", "ancient", "angry", "arctic", "awful", "basic", "bitter", "blank",
    "bold", "brave", "brief", "bright", "broad", "broken", "busy", "calm", "careful", "casual", "cheap", "chief",
    "civil", "clean", "clever", "close", "cloudy", "coastal", "cold", "common", "cool", "crazy", "crisp", "cruel",
    "curious", "damp", "dark", "dear", "deep", "dense", "direct", "dizzy", "dry", "dusty", "eager", "early", "easy",
    "elastic", "empty", "equal", "exact", "faint", "fair", "false", "famous", "fancy", "fast", "fierce", "final",
    "firm", "flat", "fluffy", "foggy", "formal", "fragile", "free", "fresh", "friendly", "frozen", "full", "funny",
    "gentle", "giant", "glad", "golden", "grand", "green", "grey", "gritty", "happy", "hard", "harsh", "heavy",
    "hidden", "hollow", "honest", "huge", "humble", "hungry", "icy", "idle", "jolly", "keen", "kind", "large", "late",
    "lazy", "legal", "light", "little", "lively", "lonely", "long", "loose", "loud", "loyal", "lucky", "mad", "magic",
    "major", "marine", "mellow", "mild", "minor", "modern", "moist", "narrow", "nasty", "neat", "nervous", "new",
    "noble", "noisy", "normal", "odd", "old", "open", "orange", "plain", "polite", "poor", "proud", "purple", "quick",
    "quiet", "rapid", "rare", "raw", "ready", "red", "rich", "rigid", "rough", "round", "royal", "rural", "rusty",
    "sad", "safe", "salty", "shaky", "sharp", "shiny", "short", "shy", "silent", "silky", "simple", "sleepy", "slim",
    "slow", "small", "smooth", "soft", "solid", "sour", "spare", "spicy", "steady", "steep", "stiff", "strange",
    "strict", "strong", "sudden", "sunny", "super", "sweet", "swift", "tall", "tame", "tender", "thick", "thin",
    "tidy", "tiny", "tough", "tricky", "true", "ugly", "upset", "urban", "vast", "violet", "vivid", "warm", "weak",
    "wet", "white", "wide", "wild", "windy", "wise", "wooden", "young", "yellow", "zany"};
const std::vector<std::string> kRulerNouns = {
    "acorn", "actor", "airport", "anchor", "angle", "apple", "apron", "arrow", "artist", "attic", "badge", "bakery",
    "balloon", "banana", "barn", "basket", "beach", "bean", "beard", "bell", "bench", "berry", "bicycle", "bird",
    "blanket", "boat", "bone", "book", "bottle", "bread", "brick", "bridge", "brush", "bucket", "butter", "button",
    "cabin", "cactus", "cake", "camel", "camera", "candle", "canoe", "canyon", "carpet", "carrot", "castle", "cat",
    "cave", "chair", "chalk", "cheese", "cherry", "chimney", "circle", "city", "clock", "cloud", "coat", "coffee",
    "coin", "comet", "copper", "corn", "cotton", "cow", "crab", "crayon", "cricket", "crown", "cup", "curtain",
    "daisy", "desert", "desk", "diamond", "dinner", "dog", "dolphin", "door", "dragon", "drum", "duck", "eagle",
    "earth", "engine", "feather", "fence", "field", "finger", "fire", "fish", "flag", "flower", "forest", "fork",
    "fountain", "fox", "frog", "garden", "gate", "ghost", "glass", "glove", "goat", "grape", "guitar", "hammer",
    "harbor", "hat", "helmet", "hill", "honey", "horse", "house", "island", "jacket", "jelly", "jungle", "kettle",
    "key", "kitten", "ladder", "lake", "lamp", "leaf", "lemon", "letter", "lion", "lizard", "machine", "map",
    "marble", "meadow", "mirror", "monkey", "moon", "mountain", "mouse", "needle", "nest", "night", "ocean", "onion",
    "orchard", "otter", "owl", "paint", "palace", "panda", "paper", "parrot", "pearl", "pencil", "pepper", "piano",
    "pillow", "pirate", "planet", "plate", "pocket", "pond", "potato", "pumpkin", "puzzle", "rabbit", "radio",
    "rain", "river", "robot", "rocket", "rope", "rose", "saddle", "sail", "salad", "sand", "scarf", "school",
    "shadow", "sheep", "shell", "ship", "shoe", "silver", "snake", "snow", "spider", "spoon", "squirrel", "star",
    "stone", "storm", "street", "sugar", "sun", "table", "teapot", "tiger", "toast", "tomato", "tower", "train",
    "tree", "tulip", "turtle", "umbrella", "valley", "violin", "wagon", "wallet", "whale", "wheel", "window",
    "wolf", "yacht", "zebra"};
const std::vector<std::string> kRulerVerbs = {
    "accept", "admire", "arrive", "bake", "balance", "bathe", "behave", "borrow", "bounce", "breathe", "build",
    "carry", "chase", "cheer", "climb", "collect", "cough", "crawl", "dance", "decide", "deliver", "dig", "dream",
    "drift", "enjoy", "escape", "explain", "fetch", "float", "fold", "gather", "giggle", "glow", "grab", "greet",
    "guard", "hammer", "hover", "hunt", "imagine", "invent", "jog", "juggle", "kneel", "knit", "laugh", "listen",
    "march", "melt", "mend", "nod", "obey", "observe", "paddle", "paint", "pause", "plant", "polish", "pour",
    "pretend", "pull", "punch", "rescue", "return", "roll", "rush", "sail", "scream", "scribble", "search", "shiver",
    "sing", "sketch", "skip", "sneeze", "sparkle", "spill", "splash", "squeeze", "stare", "stir", "stretch",
    "swim", "tickle", "travel", "tumble", "twist", "unfold", "vanish", "wander", "whisper", "wiggle", "wink",
    "wobble", "worry", "yawn", "yell", "zoom"};

}  // namespace kvlab
