"""A person's turn that changes nothing of what is asked keeps the loop in view.

Customer-facing agents (τ-bench, τ²-bench and their like) get a person's message after every answer: the customer
keeps writing while the agent answers alike. Each shape here is written from those runs (a simulated customer, the
airline policy's tools and their validation errors, τ-bench's ReAct harness); next to it, the healthy conversation
of the same look that must stay clean."""

from __future__ import annotations

import orjson
import pytest

from proxy.detect.engine import Decision, DetectConfig, episodes
from proxy.detect.texts import warning_text
from tests.convo import analyze, assistant, step, user

DEFAULT = DetectConfig()  # threshold 3: warned at the 3rd and 4th, stopped at the 5th
LENIENT = DetectConfig(tool_call_threshold=5)  # the `lenient` preset
LADDERS = {"default": DEFAULT, "lenient": LENIENT}

SYSTEM = {"role": "system", "content": "# Airline Agent Policy\nThe current time is 2024-05-15 15:00:00 EST.\n"
                                       "As an airline agent, you can help users book, modify, or cancel flight "
                                       "reservations."}


def chat(*parts) -> list[dict]:
    messages = [SYSTEM]
    for part in parts:
        messages.extend(part if isinstance(part, list) else [part])
    return messages


def found(messages, config=DEFAULT):
    state, _ = analyze(config, messages)
    return [(e.type, e.detail["strength"], e.is_stop) for e in episodes(config, state)]


def turns_found(messages, config=DEFAULT):
    state, _ = analyze(config, messages)
    return [(e.turn, e.type, e.is_stop) for e in episodes(config, state)]


# -- the same reply, turn after turn, while the customer rephrases ----------------------------------------------

REPHRASE = ("I'm sorry, but I couldn't understand your request. Could you please rephrase it or provide more "
            "details about what you would like to do with your reservation?")
CONFIRMATIONS = [
    "Yes, I'd like to go ahead and cancel it.",
    "Yes, please cancel the reservation.",
    "I confirm. Please proceed with the cancellation.",
    "Yes. Cancel it, please.",
    "I'm saying yes, go ahead and cancel my reservation.",
    "Yes, I confirm the cancellation of that booking.",
    "Please just cancel it. Yes.",
    "Yes, proceed.",
    "Can you cancel it? I already said yes.",
    "I'm confirming: cancel the reservation, please.",
    "Why do you keep asking me to rephrase? Yes, cancel it.",
]


def rephrase_loop(count: int) -> list[dict]:
    opening = [user("Hi, I need to cancel my reservation EHGLP3, I booked it yesterday."),
               *step("get_reservation_details", {"reservation_id": "EHGLP3"},
                     '{"reservation_id": "EHGLP3", "user_id": "emma_kim_9957", "origin": "PHX", "destination": '
                     '"JFK", "flight_type": "one_way", "cabin": "economy", "insurance": "no", "status": "active"}'),
               assistant("I found reservation EHGLP3 from PHX to JFK, booked yesterday, so it can be cancelled. "
                         "Do you want me to cancel it? Please answer yes to confirm.")]
    rest = []
    for n in range(count):
        rest += [user(CONFIRMATIONS[n % len(CONFIRMATIONS)]), assistant(REPHRASE)]
    return chat(*opening, *rest)


@pytest.mark.parametrize("ladder", list(LADDERS))
def test_the_same_reply_after_each_of_the_customers_rephrasings_is_warned_and_never_stopped(ladder):
    config = LADDERS[ladder]
    threshold = config.tool_call_threshold + 1  # one turn more across a person's messages
    messages = rephrase_loop(10)
    result = found(messages, config)
    assert result == [("reply", "weak", False)] * (10 - threshold + 1)  # weak evidence alone never stops
    state, _ = analyze(config, messages)
    first = episodes(config, state)[0]
    assert first.evidence.repeats == threshold
    # The warning goes after the reply that completed the loop, before the customer's next message: the model
    # reads it in its next request; it names what repeated.
    assert messages[first.place]["role"] == "user"
    assert "couldn't understand your request" in warning_text(first)


def test_fewer_repeats_of_the_reply_than_that_are_nothing():
    assert found(rephrase_loop(3)) == []


def test_the_warnings_of_the_reply_loop_stay_in_every_later_request():
    config = DEFAULT
    before = episodes(config, analyze(config, rephrase_loop(5))[0])
    after = episodes(config, analyze(config, rephrase_loop(7))[0])
    assert [(e.place, e.number) for e in after[:len(before)]] == [(e.place, e.number) for e in before]


# -- τ-bench's ReAct agent re-sending the same action its harness cannot read -----------------------------------

REACT_SYSTEM = {"role": "system", "content": "# Airline Agent Policy\n...\n# Instruction\nYou need to act as an "
                                             "agent that use the above tools to help the user according to the "
                                             "above policy.\n\nAt each step, your generation should have exactly "
                                             "the following format:\nThought:\n<A single line of reasoning>\n"
                                             "Action:\n{\"name\": <The name of the action>, \"arguments\": <The "
                                             "arguments to the action in json format>}"}
# The JSON is cut off (a brace short): the harness sends the text after `Action:` to the customer as it is.
MALFORMED = ('{"name": "update_reservation_flights", "arguments": {"reservation_id": "NM1VX1", "cabin": "economy", '
             '"flights": [{"flight_number": "HAT078", "date": "2024-05-20"}], "payment_id": "gift_card_9405163"}')
THOUGHTS = [
    "The user confirmed, so I can now update the flight.",
    "I need to update the reservation with the new flight now that the user agreed.",
    "The user wants to proceed; I will make the flight change.",
    "Proceeding with the update of the reservation flights as confirmed.",
    "I should call the update tool with the new flight details.",
    "The user is waiting; let me update the reservation.",
    "I will update the flights of reservation NM1VX1 now.",
    "Let me retry updating the reservation flights.",
    "The update has to be made with the gift card.",
    "I'll make the update the user asked for.",
]
CUSTOMER_AGAIN = [
    "Yes, please go ahead and change the flight.",
    "I'm not sure what that means. Did the change go through?",
    "That looks like some code. Can you confirm my flight was changed?",
    "I still don't see a confirmation. Could you please make the change?",
    "You sent me the same thing again. Is my flight changed or not?",
    "Hello? Please just confirm the change to flight HAT078.",
    "This is the same message again. Can you please complete the change?",
    "I keep getting the same text from you. What is happening?",
    "It seems we're stuck in a loop. Can you help me or not?",
    "I think we are stuck in a loop here.",
]


def react(thought: str, action: str) -> dict:
    return assistant(f"Thought:\n{thought}\nAction:\n{action}")


def malformed_react_loop(count: int) -> list[dict]:
    search = orjson.dumps({"name": "get_reservation_details", "arguments": {"reservation_id": "NM1VX1"}}).decode()
    messages = [REACT_SYSTEM, user("Hi, I'd like to change the flight of my reservation NM1VX1 to HAT078."),
                react("I need the reservation details first.", search),
                user('API output: {"reservation_id": "NM1VX1", "user_id": "raj_sanchez_7340", "flights": '
                     '[{"flight_number": "HAT136", "date": "2024-05-20"}], "cabin": "economy"}'),
                react("I should confirm with the user.", orjson.dumps({"name": "respond", "arguments": {
                    "content": "Your reservation NM1VX1 is on HAT136. Shall I change it to HAT078, paid with your "
                               "gift card? Please confirm (yes/no)."}}).decode())]
    for n in range(count):
        messages += [user(CUSTOMER_AGAIN[n % len(CUSTOMER_AGAIN)]), react(THOUGHTS[n % len(THOUGHTS)], MALFORMED)]
    return messages


@pytest.mark.parametrize("ladder", list(LADDERS))
def test_the_same_unreadable_react_action_sent_to_the_customer_again_and_again_is_warned_never_stopped(ladder):
    config = LADDERS[ladder]
    threshold = config.tool_call_threshold + 1
    result = found(malformed_react_loop(10), config)
    assert result == [("reply", "weak", False)] * (10 - threshold + 1)
    state, _ = analyze(config, malformed_react_loop(10))
    # It names the action as the customer got it, not the thought that changed each time.
    assert "update_reservation_flights" in episodes(config, state)[0].evidence.reply


def test_six_resends_of_the_unreadable_action_are_warned_with_either_ladder():
    assert found(malformed_react_loop(6), LENIENT) == [("reply", "weak", False)]
    assert len(found(malformed_react_loop(6))) == 3


def test_react_actions_in_json_are_steps_and_their_api_output_is_the_harness():
    # The same lookup answered alike three times by the harness (`API output:`): a loop within one task.
    search = orjson.dumps({"name": "get_user_details", "arguments": {"user_id": "raj_sanchez_7340"}}).decode()
    answer = user('API output: {"user_id": "raj_sanchez_7340", "name": {"first_name": "Raj"}, "reservations": []}')
    messages = [REACT_SYSTEM, user("What reservations do I have? My id is raj_sanchez_7340.")]
    for thought in ("Let me look the user up.", "I will check the user details.", "Checking the user again."):
        messages += [react(thought, search), answer]
    assert found(messages) == [("tool_call", "strong", False)]


# -- the same failing call after each customer message ------------------------------------------------------------

PAYMENT_ERROR = "Error: payment amount does not add up, total price is 1203, but paid 833"
BOOK = {"user_id": "sophia_silva_7557", "origin": "ORD", "destination": "PHL", "flight_type": "one_way",
        "cabin": "economy", "flights": [{"flight_number": "HAT271", "date": "2024-05-26"}],
        "passengers": [{"first_name": "Sophia", "last_name": "Silva", "dob": "1957-10-05"}],
        "payment_methods": [{"payment_id": "certificate_8045380", "amount": 500},
                            {"payment_id": "gift_card_5094406", "amount": 333}],
        "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no"}
CUSTOMER_PUSHES = ["Yes, please book it.", "OK, can you try booking it again?", "Please go ahead with the booking.",
                   "Yes, I still want that flight booked.", "Can you please just book it?"]


def failing_booking_loop(count: int) -> list[dict]:
    parts = [user("I want to book the HAT271 flight from Chicago to Philadelphia on May 26, economy.")]
    for n in range(count):
        parts += [step("book_reservation", BOOK, PAYMENT_ERROR),
                  assistant("I'm sorry, the booking didn't go through because the payment amounts don't add up. "
                            f"Let me fix that (attempt {n + 1})."),
                  user(CUSTOMER_PUSHES[n])]
    return chat(*parts)


def test_the_same_failing_call_after_each_customer_message_is_strong_and_stops():
    assert found(failing_booking_loop(2)) == []
    # The same call with the same result (its error), after each of three messages: strong, warned, then stopped.
    assert found(failing_booking_loop(3)) == [("tool_call", "strong", False)]
    assert found(failing_booking_loop(5)) == [("tool_call", "strong", False)] * 2 + [("tool_call", "strong", True)]
    # The warning stands after the failing call's result, where the model reads it.
    state, _ = analyze(DEFAULT, failing_booking_loop(3))
    first = episodes(DEFAULT, state)[0]
    assert failing_booking_loop(3)[first.place - 1]["role"] == "tool"
    assert "book_reservation" in warning_text(first)


def test_a_customer_asking_again_on_purpose_and_getting_what_a_lookup_found_is_clean():
    info = '{"hotel": "Costa Verde", "check_in": "15:00", "check_out": "11:00", "breakfast": "07:00-10:00"}'
    answer = "Check-in at Hotel Costa Verde is from 15:00, and check-out is until 11:00."
    parts = []
    for ask in ["What time is check-in?", "Sorry, what time was check-in again?", "Check-in is at what time, again?",
                "Just to be sure, when can I check in?"]:
        parts += [user(ask), *step("get_hotel_info", {}, info), assistant(answer)]
    assert found(chat(*parts)) == []


# -- handing the customer over again and again -------------------------------------------------------------------

TRANSFER = {"summary": "The user wants to change the passenger name on reservation K1NW8N, which the policy does "
                       "not allow."}
NOT_TRANSFER = ["Please don't transfer me, I just need the name fixed.", "No, I don't want to talk to someone else.",
                "Why are you transferring me again? Can't you do it?", "I said I don't want to be handed off.",
                "Stop transferring me, please."]


def handoff_loop(count: int) -> list[dict]:
    parts = [user("I need to change the passenger name on my reservation K1NW8N from Jon to John.")]
    for n in range(count):
        parts += [step("transfer_to_human_agents", TRANSFER, "Transfer successful"),
                  assistant("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."),
                  user(NOT_TRANSFER[n])]
    return chat(*parts)


def test_the_same_hand_off_again_after_each_customer_message_is_a_loop():
    assert found(handoff_loop(2)) == []
    assert [(kind, stop) for kind, _, stop in found(handoff_loop(5))] == [
        ("tool_call", False), ("tool_call", False), ("tool_call", True)]


# -- healthy conversations of the same look ------------------------------------------------------------------------

def test_the_next_one_please_with_the_same_tool_on_new_arguments_is_clean():
    parts = [user("Can you check the status of my orders? Start with #W2378156.")]
    for n, order in enumerate(["#W2378156", "#W4817420", "#W6304490", "#W9077205", "#W1092119"]):
        parts += [step("get_order_details", {"order_id": order},
                       orjson.dumps({"order_id": order, "status": "delivered" if n % 2 else "pending",
                                     "items": [{"name": "T-Shirt", "item_id": str(1000 + n)}]}).decode()),
                  assistant(f"Order {order} is {'delivered' if n % 2 else 'pending'}."),
                  user("And the next one?")]
    assert found(chat(*parts)) == []


def test_a_customer_polling_while_the_status_changes_is_clean():
    parts = [user("I requested a refund for order #W2378156. Is it done?")]
    for n, status in enumerate(["refund requested", "refund approved", "refund processing", "refund processing",
                                "refund sent to bank"]):
        parts += [step("get_refund_status", {"order_id": "#W2378156"},
                       orjson.dumps({"order_id": "#W2378156", "status": status, "checked": n}).decode()),
                  assistant("Not yet: the refund is still being processed. I'll be happy to check again later."),
                  user(["Is it done now?", "How about now?", "And now?", "Any update?", "Is it done yet?"][n])]
    assert found(chat(*parts)) == []


def test_the_same_greeting_to_different_people_is_clean():
    greeting = "Hello! Welcome to the help desk. How can I help you today?"
    parts = []
    for name, text in [("ana", "hi"), ("bo", "hello there"), ("cy", "hey"), ("di", "good morning"), ("ed", "hi!")]:
        parts += [{"role": "user", "name": name, "content": text}, assistant(greeting)]
    assert found(chat(*parts)) == []


def test_a_chat_assistant_answering_similar_questions_is_clean():
    parts = []
    for city, temp in [("Paris", 18), ("Lyon", 21), ("Nice", 24), ("Lille", 15), ("Nantes", 19)]:
        parts += [user(f"What's the weather like in {city} today?"),
                  assistant(f"In {city} it is {temp}°C today, partly cloudy, with a light wind from the west.")]
    assert found(chat(*parts)) == []


def test_a_customer_rephrasing_while_the_agent_makes_progress_is_clean():
    parts = [user("I want to change my flight."),
             assistant("Sure, could you give me your user id and the reservation number?"),
             user("My user id is mia_li_3668."),
             *step("get_user_details", {"user_id": "mia_li_3668"},
                   '{"user_id": "mia_li_3668", "reservations": ["NO6JO3", "AIXC49"]}'),
             assistant("You have reservations NO6JO3 and AIXC49. Which one do you want to change?"),
             user("The one to Seattle, sorry I didn't say."),
             *step("get_reservation_details", {"reservation_id": "NO6JO3"}, '{"destination": "SEA"}'),
             assistant("NO6JO3 goes to Seattle. Which date would you like instead?"),
             user("I meant I want a later flight on the same day."),
             *step("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"},
                   '[{"flight_number": "HAT083", "time": "18:00"}]'),
             assistant("HAT083 leaves at 18:00. Shall I change it?")]
    assert found(chat(*parts)) == []


def test_a_customer_giving_new_facts_each_time_starts_afresh():
    ask = "I couldn't find a reservation with that number. Could you double-check it?"
    parts = [user("Please cancel my reservation.")]
    for number in ["ABC123", "ABD123", "XJ9KL2", "XJ9KL3", "Q7TT11"]:
        parts += [user(f"It's {number}."),
                  *step("get_reservation_details", {"reservation_id": number},
                        f"Error: reservation {number} not found"),
                  assistant(ask)]
    assert found(chat(*parts)) == []


def test_the_refusal_a_person_keeps_pushing_against_is_warned_late_and_never_stopped():
    refusal = ("I'm sorry, but basic economy reservations cannot be modified. I can help you cancel it if it "
               "was booked within the last 24 hours.")
    pushes = ["But I really need to move it to Friday.", "Can you make an exception this once?",
              "Is there really nothing you can do?", "Please, it's for a funeral."]
    parts = [user("I want to change my basic economy flight to Friday.")]
    for push in pushes:
        parts += [assistant(refusal), user(push)]
    parts.append(assistant(refusal))
    result = found(chat(*parts))
    assert result == [("reply", "weak", False)] * 2  # the 4th and 5th: one turn later than for a harness
    assert Decision(episodes(DEFAULT, analyze(DEFAULT, chat(*parts))[0])).stop is None
